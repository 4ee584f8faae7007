"""What a caller has used of every limit that applies to them, for a customer's dashboard or an
`/api/usage` view: one look at Redis (nothing is counted), calendar quotas and rate limits alike."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import NamedTuple, Sequence

from . import engine, policies, quotas
from .boundary import USAGE, guarded
from .conf import get_setting
from .drivers import Steps, arun, run
from .limiter import loading
from .plans import limit_in_effect
from .rates import human_usage
from .subjects import identifies_the_caller, subject_for
from .values import REQUESTS, Check, Decision, Unavailable


class Usage(NamedTuple):
    """One limit the caller is subject to: how much of it they used, and when it is back."""

    policy: str  # the policy's name, as the RateLimit headers name it
    used: int  # units counted in the current window or period
    limit: int  # the caller's limit (their plan's, an override's, or the policy's)
    remaining: int
    resets_at: datetime  # when the count is back to zero (a quota: when the next period starts), UTC
    period: str  # 'day', 'week' or 'month' for a calendar quota, '' for a window of seconds
    window: int  # seconds of the window, or of the current period
    plan: str | None  # the plan that set the limit, None (JSON null) when none did, as the live page's JSON
    unit: str = REQUESTS  # what `used`, `limit`, `remaining` and `overage` count: requests, tokens, content-bytes
    overage: int = 0  # used beyond the limit (a request settled more than its estimate): for billing

    def as_dict(self) -> dict:
        """For a JSON answer (resets_at as ISO 8601)."""
        return {**self._asdict(), "resets_at": self.resets_at.isoformat()}

    def __str__(self) -> str:
        """'7,412,009 / 10,000,000 tokens this month', '41 / 100 requests per 1 min'."""
        return human_usage(self.used, self.limit, self.unit, self.window, self.period)


def _checks(request, index: policies.PolicyIndex) -> list[Check]:
    """Every enforced policy whose subject is the caller's own, at the caller's limit (exemptions left out)."""
    limits = index.limits_for(request)
    checks = []
    for policy in index.policies:
        if not policy.enforce or policy.holds:
            continue  # shadow policies never show to clients; requests in flight are no usage
        if not identifies_the_caller(policy.key_spec):
            continue  # a subject the request only names (?username=alice) is someone else's usage
        subject = subject_for(policy.key_spec, request)
        if subject is None:
            continue
        limit, plan_name, _override = limit_in_effect(limits, policy.id, policy.limit)
        if limit is not None:
            checks.append(Check(policy, subject, limit, plan_name or ""))
    return checks


def _usage(checks: Sequence[Check], decisions: Sequence[Decision]) -> list[Usage]:
    now = datetime.now(timezone.utc)
    return [
        Usage(
            check.policy.name, decision.count, decision.limit, decision.remaining,
            _resets_at(check, decision, now),
            check.policy.period, decision.window or check.policy.window, check.plan or None,
            check.policy.unit, max(decision.count - decision.limit, 0),
        )
        for check, decision in zip(checks, decisions)
    ]


def _resets_at(check: Check, decision: Decision, now: datetime) -> datetime:
    if check.policy.plugin:  # a quota starts again with its next period, used or not
        again = check.policy.plugin.starts_again(check.policy, int(now.timestamp() * 1000))
        if again is not None:
            return quotas.as_datetime(again)
    return (now + timedelta(seconds=decision.reset_in) if decision.count else now).replace(microsecond=0)


def using(request) -> Steps[list[Usage]]:
    """The caller's usage of every limit that applies to them, counting nothing (raises
    engine.RedisUnavailable when Redis cannot answer)."""
    if not get_setting("RATELIMIT_ENABLED"):
        return []
    checks = _checks(request, (yield from loading(request)))
    verdict = yield from engine.deciding(checks, dry_run=True)
    return _usage(checks, verdict.decisions)


def _unavailable(error: BaseException) -> list[Usage]:
    """usage() when the limiter failed: it cannot say, whatever RATELIMIT_FAIL_OPEN (an empty list would
    say "nothing used"); the middleware answers the error 503."""
    if isinstance(error, Unavailable):
        raise error
    raise Unavailable(f"the limiter could not read the caller's usage ({error!r})") from error


def usage(request) -> list[Usage]:
    return run(guarded(using(request), USAGE, _unavailable))


async def ausage(request) -> list[Usage]:
    return await arun(guarded(using(request), USAGE, _unavailable))
