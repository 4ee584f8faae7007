"""The one core behind every door: find the policies of a request, ask the engine once, keep the answer.
Which door calls it, and when, is doors.py's; the I/O is yielded to a driver (drivers.py)."""

from __future__ import annotations

import logging
import secrets
from operator import attrgetter
from typing import Callable, Iterable, NamedTuple, Sequence, Union

from . import engine, events, metrics, policies
from .closing import Closing, closing_of
from .conf import get_setting
from .events import outage
from .deny_cache import deny_cache
from .deny_cache import enabled as deny_cache_enabled
from .drivers import Io, Steps, nothing, steps
from .plans import limit_in_effect
from .subjects import subject_for
from .values import Check, CompiledPolicy, Decision, Held, Verdict, charge, splits

logger = logging.getLogger("ratelimit_app")
_made = tuple.__new__


Cost = Union[int, Callable[[object], int]]  # units, or a function of the request that says how many


def valid_cost(cost: object, where: str = "a cost") -> int:
    """A cost as the engine takes it: a whole number of units, at least 1 (a computed 0 costs 1)."""
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"{where} must be a whole number of units, not {cost!r}")
    return max(cost, 1)


def request_cost(request, state: RequestState, index: policies.PolicyIndex, code: Cost | None = None) -> int:
    """The units a request takes from each of its policies: the admin's cost of an action it meets
    wins (an operator changes it without a deploy), then the code's (`code`, else the doors'), else 1."""
    if index.costs:
        found = index.cost_of(path=request.path_info, names=state.names)
        if found is not None:
            return found
    code = state.cost if code is None else code
    if code is None:
        return 1
    units = code(request) if callable(code) else code
    if units is None:  # a function with nothing to say (a DRF view's get_throttle_cost): the default
        return 1
    return valid_cost(units, "the cost the view's code gives")


class RequestState:
    """What the doors know and decided about one request so far."""

    __slots__ = (
        "names", "decided", "decisions", "denied", "unavailable", "outage", "awaiting", "refused", "json_api", "cost",
        "lease", "closing",
    )

    def __init__(self, names: Iterable[str | None] = ()) -> None:
        self.names: list[str] = []  # the names policies may match, gathered by every door
        self.decided: set[int] = set()  # ids of the policies already decided
        self.decisions: list[Decision] = []
        self.denied: list[Decision] = []
        self.unavailable = False  # Redis could not be asked and RATELIMIT_FAIL_OPEN is False
        self.outage: engine.RedisUnavailable | None = None  # why Redis could not be asked, either way
        self.awaiting = False  # an outer door (middleware, decorator) left the call to a door inside the view
        self.refused = False  # a door refused the request (its response is the refusal)
        self.json_api = False  # the view is a DRF API: its clients expect JSON
        self.cost: Cost | None = None  # what the view's code says the request costs (None: nothing)
        self.lease = ""  # what in-flight policies name this request's places after ('' until one applies)
        self.closing: Closing | None = None  # what it holds until it ends (closing.py), once it holds anything
        self.add_names(names)

    def add_names(self, names: Iterable[str | None]) -> None:
        for name in names:
            if name and name not in self.names:
                self.names.append(name)


def pending_checks(request, state: RequestState, index: policies.PolicyIndex | None = None,
                   matched: Sequence[CompiledPolicy] | None = None) -> list[Check]:
    """The checks of every policy this request meets (by path and gathered names) not decided yet;
    `matched`: the policies a door found for the state's names already.

    plan() made into checks, without its Planned values: this runs on every request.
    """
    index = policies.get_index() if index is None else index
    checks: list[Check] = []
    if not index.policies:
        return checks
    decided = state.decided
    limits = index.limits_for(request) if index.tailored else None
    if matched is None:
        matched = index.matching(path=request.path_info, names=state.names, method=request.method)
    for policy in matched:
        if policy.id in decided:
            continue
        subject = subject_for(policy.key_spec, request)
        if subject is None:
            continue
        if limits is None:  # most requests: the policy's own limit, no lookup
            checks.append(Check(policy, subject, policy.limit))
            continue
        limit, plan_name, _override = limit_in_effect(limits, policy.id, policy.limit)
        if limit is None:
            metrics.record_exempt(policy)
        else:
            checks.append(Check(policy, subject, limit, plan_name))
    return checks


def settle(request, state: RequestState, checks: list[Check], verdict: Verdict, epoch: int | None) -> None:
    """Keep what the engine said on the request; shadow policies that would deny are logged.
    `epoch`: the deny cache's, read before Redis was asked (deny_cache.remember); None: not for memory."""
    policies.observe_version(verdict.version)
    metrics.record_verdict(verdict)
    state.decided.update(map(_POLICY_ID, checks))  # in C: a loop of Python cost every policy of every request
    state.decisions += verdict.decisions
    denied = state.denied
    for decision in verdict.decisions:  # one pass: the denials, and the shadow policies that would deny
        if not decision.allowed:
            denied.append(decision)
        elif decision.exceeded:
            _report_shadow(decision, request)
    if denied and epoch is not None and deny_cache_enabled():
        deny_cache.remember(verdict.decisions, epoch)


_POLICY_ID = attrgetter("policy.id")


def denied_from_memory(state: RequestState, checks: list[Check], cost: int = 1) -> bool:
    """Refuse the request from the deny cache when a subject of it still has no room for `cost` units."""
    cached = deny_cache.denied(checks, cost) if deny_cache_enabled() else ()
    if not cached:
        return False
    metrics.record_verdict(Verdict(False, tuple(cached), None))
    for decision in cached:
        metrics.deny_cache_hit(decision.policy)
    state.decided.update(check.policy.id for check in checks)  # all-or-nothing: nothing counted anywhere
    state.decisions.extend(cached)
    state.denied.extend(cached)
    return True


def unavailable(request, state: RequestState, error: engine.RedisUnavailable) -> None:
    outage.record(error, request)
    state.outage = error
    fail_open = get_setting("RATELIMIT_FAIL_OPEN")
    metrics.record_outage(fail_open)
    if not fail_open:
        state.unavailable = True


class Call(NamedTuple):
    """The one Redis call a request needs: its checks, the units it takes from each, and the deny
    cache's epoch when they were made (a reset or reload meanwhile voids the refusals for memory;
    None: a time given by the caller, which the memory of the real clock neither answers nor learns from)."""

    checks: list[Check]
    epoch: int | None
    cost: int = 1
    lease: str = ""  # the request's lease, when an in-flight policy is among the checks
    holding: tuple[Held, ...] = ()  # the places the call may take, under the lease


def prepare(request, state: RequestState, index: policies.PolicyIndex | None, extra: Sequence[Check] = (),
            pending: bool = True, now: float | None = None, cost: Cost | None = None,
            matched: Sequence[CompiledPolicy] | None = None) -> Call | None:
    """Plan -> overrides and plans -> cost -> deny cache: the call to make, or None when Redis need not be asked
    (no policy applies, or memory refuses the request). `extra`: checks a door computed itself
    (compat); `cost`: the code's cost for this call, in place of the doors'."""
    index = policies.get_index() if index is None else index
    checks = pending_checks(request, state, index, matched) if pending else []
    checks += extra
    if not checks:
        return None
    # most requests: no cost anywhere, no policy in flight; each costs one attribute read then
    units = 1 if cost is None and state.cost is None and not index.costs else request_cost(request, state, index, cost)
    lease, holding = "", ()
    if index.holds and any(check.policy.holds for check in checks):
        lease = lease_of(state)  # named before the call: a call left unanswered is given back too
        # a cost that never fits holds nothing, and its give-back would only write a mark
        split = units != 1 and splits(checks, units)
        holding = tuple(Held(check.policy, check.subject, lease, charged) for check in checks
                        if check.policy.holds
                        and (charged := charge(check.policy, units, split)) <= check.policy.largest_cost(check.limit))
    if now is not None:
        return Call(checks, None, units, lease, holding)
    if denied_from_memory(state, checks, units):
        return None
    return _made(Call, (checks, deny_cache.epoch, units, lease, holding))  # Call(...): a Python __new__ per request


def lease_of(state: RequestState) -> str:
    """The request's lease: random, so that no two requests anywhere give back each other's places."""
    if not state.lease:
        state.lease = secrets.token_hex(8)
    return state.lease


def asking(request, state: RequestState, call: Call) -> None:
    """Before the call is sent: the request may hold its places from now on, answered or not; its
    closing step gives them back (closing.py)."""
    if state.closing is None:
        state.closing = closing_of(request)
    state.closing.hold(call.holding)


def conclude(request, state: RequestState, call: Call, outcome: Verdict | engine.RedisUnavailable) -> None:
    """Settle what Redis said, or apply the failure rule when it could not say (then the places the
    call may have taken stay the request's, to give back when it ends)."""
    if isinstance(outcome, engine.RedisUnavailable):
        unavailable(request, state, outcome)
        return
    settle(request, state, call.checks, outcome, call.epoch)
    if outcome.metered:  # admitted on its estimates in metered policies: settled as it ends
        if state.closing is None:
            state.closing = closing_of(request)
        state.closing.charge(outcome.metered)
    if call.holding:
        # a refused request took nothing anywhere; an admitted one holds where its policy had room
        taken = {(d.policy.id, d.subject) for d in outcome.decisions
                 if outcome.allowed and d.policy.holds and not d.exceeded}
        state.closing.forget([place for place in call.holding if (place.policy.id, place.subject) not in taken])


@steps
def loading(request, index: policies.PolicyIndex | None = None) -> Steps[policies.PolicyIndex]:
    """The policy index (no I/O while it is fresh), and the user when a policy reads it: async code loads
    it ahead, so that computing subjects never queries from the event loop."""
    if index is None:
        index = policies.fresh_index()
        if index is None:
            index = yield Io(policies.get_index, policies.aget_index)
    if index.needs_user:
        yield Io(nothing, resolve_user, (request,))
    return index


@steps
def deciding(request, state: RequestState, index: policies.PolicyIndex | None = None, *, extra: Sequence[Check] = (),
             pending: bool = True, now: float | None = None, cost: Cost | None = None,
             matched: Sequence[CompiledPolicy] | None = None) -> Steps[RequestState]:
    """Decide every pending policy of the request (and `extra`) in one Redis call, none when nothing applies;
    `matched`: the policies the door matched the state's names with (pending_checks)."""
    if index is None or index.needs_user:  # the doors pass the index they matched with: most often no step left
        index = yield from loading(request, index)
    denied_before = len(state.denied)
    call = prepare(request, state, index, extra, pending, now, cost, matched)
    if call is not None:
        if call.holding:
            asking(request, state, call)
        try:
            outcome = yield from engine.deciding(call.checks, now=now, version=policies.version_due(), cost=call.cost,
                                                 lease=call.lease)
        except engine.RedisUnavailable as error:
            outcome = error
        conclude(request, state, call, outcome)
    if len(state.denied) > denied_before:
        yield Io(events.denied, events.adenied, (request, state.denied[denied_before:]))
    return state


async def resolve_user(request) -> None:
    """Load the user with Django's async API, so computing subjects later never queries from the event loop."""
    auser = getattr(request, "auser", None)
    if auser is not None:
        request.user = await auser()


def _report_shadow(decision: Decision, request) -> None:
    logger.info(
        "ratelimit: shadow policy %r would deny %s %s for %s (%d/%d)",
        decision.policy.name, request.method, request.path_info, decision.subject.display,
        decision.count, decision.limit,
    )
