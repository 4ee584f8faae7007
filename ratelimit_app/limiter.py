"""The one core behind every door: find the policies of a request, ask the engine, remember the answer.

A request seen by several doors (the middleware, then the DRF throttle) is decided once per policy:
the decisions are kept on the underlying HttpRequest and later doors only add the policies that
were not decided yet (e.g. a `user` policy once DRF has authenticated a token).
"""

from __future__ import annotations

import logging
from typing import Iterable, NamedTuple

from . import engine, policies
from .conf import get_setting
from .connection import outage
from .engine import Check, Decision, Verdict
from .overrides import CompiledOverride, matching_override
from .policies import CompiledPolicy
from .subjects import Subject, subject_for

logger = logging.getLogger("ratelimit_app")
STATE_ATTRIBUTE = "_ratelimit"


class Planned(NamedTuple):
    """One policy that applies to a request: who it counts, which override (if any), the limit in effect."""

    policy: CompiledPolicy
    subject: Subject
    override: CompiledOverride | None
    limit: int | None  # None: the subject is exempt


class RequestState:
    """What the doors decided for one request so far."""

    __slots__ = ("decided", "decisions", "denied", "unavailable")

    def __init__(self) -> None:
        self.decided: set[int] = set()
        self.decisions: list[Decision] = []
        self.denied: list[Decision] = []
        self.unavailable = False  # Redis could not be asked and RATELIMIT_FAIL_OPEN is False


def http_request(request):
    """The Django HttpRequest behind a DRF Request (or the request itself)."""
    return request.__dict__.get("_request", request)  # a dict lookup: no AttributeError raised per request


def state_of(request) -> RequestState:
    base = http_request(request)
    state = base.__dict__.get(STATE_ATTRIBUTE)
    if state is None:
        state = base.__dict__[STATE_ATTRIBUTE] = RequestState()
    return state


def plan(
    request,
    names: Iterable[str | None] = (),
    *,
    skip: set[int] | frozenset[int] = frozenset(),
    defer_anonymous_user_policies: bool = False,
) -> list[Planned]:
    """The policies that apply to the request (found by path, method and `names`), with subjects and limits.

    `defer_anonymous_user_policies` leaves out policies counted per user while the request's user is
    anonymous, so that a later door that authenticates (DRF) decides them for the right subject.
    """
    index = policies.get_index()
    if not index:
        return []
    found = index.matching(path=request.path_info, names=names, method=request.method)
    if defer_anonymous_user_policies and not _authenticated(request):
        found = [policy for policy in found if not policy.counts_users]
    planned = []
    for policy in found:
        if policy.id in skip:
            continue
        subject = subject_for(policy.key_spec, request)
        if subject is None:
            continue  # e.g. a `user` policy on an anonymous request does not apply
        override = matching_override(index.overrides.get(policy.id), request) if index.overrides else None
        limit = policy.limit if override is None else (None if override.exempt else override.limit)
        planned.append(Planned(policy, subject, override, limit))
    return planned


def _authenticated(request) -> bool:
    user = getattr(request, "user", None)
    return user is not None and user.is_authenticated


def evaluate(
    request, names: Iterable[str | None] = (), *, dry_run: bool = False, defer_anonymous_user_policies: bool = False
) -> RequestState | None:
    """Decide the policies of this request not decided yet; None when rate limiting is switched off."""
    if not get_setting("RATELIMIT_ENABLED"):
        return None
    state = state_of(request)
    planned = plan(request, names, skip=state.decided, defer_anonymous_user_policies=defer_anonymous_user_policies)
    checks = [Check(p.policy, p.subject, p.limit) for p in planned if p.limit is not None]
    if not checks:
        return state
    try:
        verdict = engine.decide(checks, dry_run=dry_run)
    except engine.RedisUnavailable as error:
        outage.record(error)
        if not get_setting("RATELIMIT_FAIL_OPEN"):
            state.unavailable = True
        return state
    policies.observe_version(verdict.version)
    if not dry_run:
        _report_shadow(verdict, request)
        state.decided.update(check.policy.id for check in checks)
        state.decisions.extend(verdict.decisions)
        state.denied.extend(verdict.denied_by)
    return state


def _report_shadow(verdict: Verdict, request) -> None:
    for decision in verdict.decisions:
        if decision.exceeded and not decision.policy.enforce:
            logger.info(
                "ratelimit: shadow policy %r would deny %s %s for %s (%d/%d)",
                decision.policy.name, request.method, request.path_info, decision.subject.display,
                decision.count, decision.limit,
            )


def check(request, action: str) -> Verdict:
    """What would happen to `request` under the policies of `action`, counting nothing."""
    checks = [Check(p.policy, p.subject, p.limit) for p in plan(request, [action]) if p.limit is not None]
    verdict = engine.decide(checks, dry_run=True)
    policies.observe_version(verdict.version)
    return verdict


def hit(request, action: str) -> Verdict:
    """Count `request` under the policies of `action` (for code that is not a view); returns the verdict."""
    state = evaluate(request, [action])
    if state is None:
        return engine.NO_POLICIES
    if state.unavailable:
        raise engine.RedisUnavailable("Redis unavailable and RATELIMIT_FAIL_OPEN is False")
    return Verdict(not state.denied, tuple(state.decisions), None)
