"""The one call to Redis on the request path: decide every applicable policy of a request in a single
Lua script (lua/decide.lua, assembled by scripts.py)."""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, NamedTuple, Sequence

from . import keys, metrics
from .conf import get_setting
from .connection import RedisUnavailable, aclient, breaker, client
from .scripts import now_arg, scripts, totals_bucket_ms

if TYPE_CHECKING:
    from .policies import CompiledPolicy
    from .subjects import Subject

__all__ = ["Check", "Decision", "Verdict", "NO_POLICIES", "RedisUnavailable", "decide", "adecide", "live_member"]


class Check(NamedTuple):
    """One policy to decide for one subject, with the limit in effect for that subject."""

    policy: CompiledPolicy
    subject: Subject
    limit: int


class Decision(NamedTuple):
    policy: CompiledPolicy
    subject: Subject
    allowed: bool  # this policy lets the request through (a shadow policy always does)
    exceeded: bool  # the request was over the limit (for a shadow policy: it would have been denied)
    count: int  # requests counted in the window, this one included when it was counted
    limit: int
    remaining: int
    reset_in: float  # seconds until every counted request has left the window
    retry_after: float | None  # seconds until a request would be admitted again, when exceeded


class Verdict(NamedTuple):
    allowed: bool
    decisions: tuple[Decision, ...]
    version: bytes | None  # the policy version token read in the same call (None when not read)

    @property
    def denied_by(self) -> tuple[Decision, ...]:
        return tuple(decision for decision in self.decisions if not decision.allowed)


NO_POLICIES = Verdict(True, (), None)


# --- deciding ----------------------------------------------------------------------------------


def decide(checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False) -> Verdict:
    """Decide every check in one Redis round trip; nothing is counted if an enforcing policy denies.

    `now` (seconds since the epoch) replaces the server's clock, for tests; `dry_run` decides
    without counting anything; `version` brings the policy version back in the same call (the
    doors ask for it when their worker is due to compare). Raises RedisUnavailable when Redis cannot answer.
    """
    if not checks:
        return NO_POLICIES
    script_keys, args = _script_call(checks, now, dry_run, version)
    redis_client = client()
    script = scripts.get("decide", redis_client)
    started = perf_counter()
    reply = breaker.call(lambda: script(script_keys, args, redis_client))
    metrics.record_call(perf_counter() - started)
    return _verdict(checks, reply)


async def adecide(
    checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False
) -> Verdict:
    """decide() for async code: the same script and keys, through redis-py's asyncio client."""
    if not checks:
        return NO_POLICIES
    script_keys, args = _script_call(checks, now, dry_run, version)
    redis_client = aclient()
    script = scripts.get_async("decide", redis_client)
    started = perf_counter()
    reply = await breaker.acall(lambda: script(script_keys, args, redis_client))
    metrics.record_call(perf_counter() - started)
    return _verdict(checks, reply)


def _script_call(checks: Sequence[Check], now: float | None, dry_run: bool, version: bool) -> tuple[list[str], list[str | int]]:
    """The KEYS and ARGV of decide.lua for these checks (`version`: bring the policy version back too)."""
    key_prefix = keys.prefix()
    script_keys: list[str] = []
    flags = ("1" if dry_run else "0") + ("+" if version else "")
    args: list[str | int] = [now_arg(now), flags, get_setting("RATELIMIT_LIVE_INDEX_SIZE"), len(checks)]
    for policy, subject, limit in checks:
        script_keys += (
            keys.counter_key(policy, subject.key, key_prefix),
            keys.live_key(policy, key_prefix),
            keys.totals_key(policy, key_prefix),
        )
        args += (
            policy.strategy, limit, policy.window_ms, policy.bucket_ms, "1" if policy.enforce else "0",
            live_member(subject, limit, policy), totals_bucket_ms(policy),
        )
    script_keys.append(keys.version_key(key_prefix))
    return script_keys, args


def _verdict(checks: Sequence[Check], reply: list[int]) -> Verdict:
    version, _now, denied = reply[0], reply[1], reply[2]
    decisions = []
    for i, (policy, subject, limit) in enumerate(checks):
        exceeded, count, reset_ms, retry_ms = reply[3 + 4 * i : 7 + 4 * i]
        capacity = policy.capacity(limit)  # a token bucket's count is compared with its burst
        # positional: this runs for every policy of every request
        decisions.append(
            Decision(
                policy, subject, not (exceeded and policy.enforce), bool(exceeded), count, limit,
                capacity - count if count < capacity else 0, reset_ms / 1000, retry_ms / 1000 if exceeded else None,
            )
        )
    return Verdict(not denied, tuple(decisions), None if version == 0 else version)


def live_member(subject: Subject, limit: int, policy: CompiledPolicy) -> str:
    """The live index entry of a subject: '<hash> <limit>[*] <display>', '*' marking an override."""
    return f"{subject.key} {limit}{'*' if limit != policy.limit else ''} {subject.display}"
