"""What both compat modules share: decide subjects computed in Python (a DRF cache key, a django-ratelimit
key) under the policies they declared, in one Redis call, with the admin's changes and overrides."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .. import policies
from ..boundary import THROTTLE, Door, faults
from ..actions import look
from ..doors import entering, state_of
from ..limiter import deciding
from ..plans import limit_in_effect
from ..registry import CodePolicy
from ..subjects import bounded_display, subject_key
from ..values import Check, Decision, Subject, Unavailable


class Want(NamedTuple):
    """One declared policy to decide for one subject; `limit` when the code computes it per request."""

    policy: CodePolicy
    subject: Subject
    limit: int | None = None


def subject(canonical: str, display: str | None = None) -> Subject:
    """A subject from the text that identifies it, hashed and shown as every subject is."""
    return Subject(subject_key(canonical), bounded_display(canonical if display is None else display))


class Undecided(Unavailable):
    """The limiter failed deciding a compat door's request (recorded by the boundary): the door applies its
    failure rule, as for Redis unreachable."""


def decide(request, wants: Sequence[Want], *, now: float | None = None, dry_run: bool = False,
           door: Door = THROTTLE) -> list[Decision | None]:
    """The decision of each want, in order; None for a policy the operator disabled or an exempt subject.

    Through the request's one pipeline (limiter.deciding): with the policies the middleware left to this
    door, the overrides, the deny cache, all-or-nothing. Inside the boundary: raises Unavailable
    (engine.RedisUnavailable, or Undecided for any other failure of the limiter's, recorded).
    """
    try:
        return _decide(request, wants, now, dry_run)
    except Unavailable:
        raise
    except Exception as error:  # noqa: BLE001 - the boundary (boundary.py): the database away, a key function
        faults.record(error, door, request)
        raise Undecided(f"the limiter could not decide ({error!r})") from error


def _decide(request, wants: Sequence[Want], now: float | None, dry_run: bool) -> list[Decision | None]:
    index = policies.get_index()  # a class or scope first seen now was declared: the index holds it
    checks = [_check(index, request, want) for want in wants]
    asked = [check for check in checks if check is not None]
    if dry_run:
        found = look(asked, now=now).decisions
    else:
        found = _counted(request, index, asked, now)
    by_subject = {(d.policy.id, d.subject): d for d in found}
    return [None if check is None else by_subject.get((check.policy.id, check.subject)) for check in checks]


def _counted(request, index: policies.PolicyIndex, checks: list[Check], now: float | None) -> list[Decision]:
    state = state_of(request)
    # the middleware left this request's one call to this door: its policies join the call
    pending, state.awaiting = state.awaiting, False
    decided, denied, state.outage = len(state.decisions), len(state.denied), None
    deciding.sync(request, state, index, extra=checks, pending=pending, now=now)
    if state.outage is not None:
        raise state.outage
    ours = {(check.policy.id, check.subject) for check in checks}
    # refused by the site's own policies (compat answers its own refusals the way its library does)
    state.refused = any((d.policy.id, d.subject) not in ours for d in state.denied[denied:])
    return state.decisions[decided:]


def refused_by_other_policies(request) -> bool:
    """Whether the request is refused by the site's own policies, deciding them now if the middleware
    left them to this door (a throttle that asks nothing itself still makes the request's one call)."""
    if getattr(request, "__dict__", None) is None:  # DRF's own tests call throttles without a real request
        return False
    state = state_of(request)
    if state.awaiting:
        entering.sync(request, (), last=True, door=THROTTLE)
    return state.refused


def _check(index: policies.PolicyIndex, request, want: Want) -> Check | None:
    declared = index.by_name.get(want.policy.values["action"], ())
    compiled = next((p for p in declared if p.name == want.policy.name), None)
    if compiled is None:
        return None  # disabled in the admin (or invalid, which is logged when loading)
    limit = compiled.limit if want.limit is None else want.limit  # a callable rate computes it per request
    limit, plan_name, _override = limit_in_effect(index.limits_for(request), compiled.id, limit)
    return None if limit is None else Check(compiled, want.subject, limit, plan_name)
