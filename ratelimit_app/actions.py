"""check() and hit() for code that is not a view: a request under the policies of an action, looked at
or counted, sync or async (the steps written once, run by either driver)."""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from . import engine, policies
from .boundary import CHECK, HIT, fail_open, faults, guarded
from .conf import get_setting
from .events import outage
from .drivers import Steps, arun, run
from .doors import state_of
from .limiter import Cost, RequestState, deciding, loading, request_cost
from .overrides import CompiledOverride
from .plans import CompiledPlan, limit_in_effect
from .subjects import subject_for
from .values import Check, CompiledPolicy, Subject, Unavailable, Verdict


class Planned(NamedTuple):
    """One policy that applies to a request: who it counts, which override (if any), the limit in effect."""

    policy: CompiledPolicy
    subject: Subject
    override: CompiledOverride | None
    limit: int | None  # None: the subject is exempt
    plan: CompiledPlan | None = None  # the request's plan, whether or not it names this policy
    by_plan: bool = False  # the plan set the limit in effect


def plan(
    request,
    names: Iterable[str | None] = (),
    *,
    skip: set[int] | frozenset[int] = frozenset(),
    index: policies.PolicyIndex | None = None,
) -> list[Planned]:
    """The policies that apply to the request (found by path, method and `names`), with subjects and limits."""
    index = policies.get_index() if index is None else index
    if not index:
        return []
    planned = []
    limits = index.limits_for(request)
    on_plan = None if limits is None else limits.plan
    for policy in index.matching(path=request.path_info, names=names, method=request.method):
        if policy.id in skip:
            continue
        subject = subject_for(policy.key_spec, request)
        if subject is None:
            continue  # e.g. a `user` policy on an anonymous request does not apply
        limit, plan_name, override = limit_in_effect(limits, policy.id, policy.limit)
        planned.append(Planned(policy, subject, override, limit, on_plan, bool(plan_name)))
    return planned


def checks_for(planned: Iterable[Planned]) -> list[Check]:
    return [Check(p.policy, p.subject, p.limit, p.plan.name if p.by_plan else "")
            for p in planned if p.limit is not None]


def looking(checks: Sequence[Check], *, now: float | None = None, cost: int = 1) -> Steps[Verdict]:
    """What Redis would answer to `checks`, counting nothing (raises RedisUnavailable)."""
    verdict = yield from engine.deciding(checks, now=now, dry_run=True, cost=cost)
    policies.observe_version(verdict.version)
    return verdict


def look(checks: Sequence[Check], *, now: float | None = None, cost: int = 1) -> Verdict:
    return run(looking(checks, now=now, cost=cost))


class Undecided(NamedTuple):
    """The limiter could not decide, and RATELIMIT_FAIL_OPEN says to refuse: raised once out of the boundary."""

    error: BaseException


def _failure_rule(error: BaseException) -> Verdict | Undecided:
    """hit() and check() when the limiter failed: an allowed verdict with no decision (fail open), else Undecided."""
    return engine.NO_POLICIES if fail_open() else Undecided(error)


def _answer(outcome: Verdict | Undecided) -> Verdict:
    if isinstance(outcome, Undecided):
        if isinstance(outcome.error, Unavailable):
            raise outcome.error
        raise Unavailable(f"the limiter could not decide ({outcome.error!r}); RATELIMIT_FAIL_OPEN is False") \
            from outcome.error
    return outcome


def checking(request, action: str, cost: Cost | None = None) -> Steps[Verdict]:
    """What would happen to `request` (of `cost` units) under the policies of `action`, counting nothing;
    inside the boundary: while the limiter cannot say, the failure rule's answer."""
    return _answer((yield from guarded(_checking(request, action, cost), CHECK, _failure_rule)))


def _checking(request, action: str, cost: Cost | None) -> Steps[Verdict]:
    if not get_setting("RATELIMIT_ENABLED"):
        return engine.NO_POLICIES
    index = yield from loading(request)
    checks = checks_for(plan(request, [action], index=index))
    try:
        return (yield from looking(checks, cost=_looked_cost(request, action, index, cost)))
    except engine.RedisUnavailable as error:
        outage.record(error, request)
        return _failure_rule(error)


def _looked_cost(request, action: str, index: policies.PolicyIndex, cost: Cost | None) -> int:
    # a look counts nothing: the request's own state stays as it was
    return request_cost(request, RequestState([action]), index, cost)


def hitting(request, action: str, cost: Cost | None = None) -> Steps[Verdict]:
    """Count `request` under the policies of `action` not decided yet for it, taking `cost` units
    (a number, or a function of the request; the admin's cost for the action wins); returns the verdict.
    Inside the boundary (boundary.guarded, written out: a generator less to make on every call): while
    the limiter cannot decide, the failure rule's answer."""
    try:
        if not get_setting("RATELIMIT_ENABLED"):
            return engine.NO_POLICIES
        state = state_of(request, [action])
        before = len(state.decisions)
        yield from deciding(request, state, cost=cost)
        if state.unavailable:
            outcome = Undecided(state.outage or Unavailable("Redis unavailable and RATELIMIT_FAIL_OPEN is False"))
        else:
            decisions = tuple(state.decisions[before:])
            outcome = Verdict(all(d.allowed for d in decisions), decisions, None)
    except Exception as error:  # noqa: BLE001 - the boundary: the site never sees the limiter's errors
        faults.record(error, HIT)
        outcome = _failure_rule(error)
    return _answer(outcome)


def check(request, action: str, cost: Cost | None = None) -> Verdict:
    return run(checking(request, action, cost))


async def acheck(request, action: str, cost: Cost | None = None) -> Verdict:
    return await arun(checking(request, action, cost))


def hit(request, action: str, cost: Cost | None = None) -> Verdict:
    return run(hitting(request, action, cost))


async def ahit(request, action: str, cost: Cost | None = None) -> Verdict:
    return await arun(hitting(request, action, cost))
