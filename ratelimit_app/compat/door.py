"""What both compat modules share: decide subjects computed in Python (a DRF cache key, a django-ratelimit
key) under the policies they declared, in one Redis call, with the admin's changes and overrides."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .. import engine, limiter, policies, registry
from ..doors import inner_door
from ..deny_cache import deny_cache
from ..limiter import state_of
from ..overrides import matching_override
from ..registry import CodePolicy
from ..subjects import _bounded, _hash
from ..values import Check, Decision, Subject


class Want(NamedTuple):
    """One declared policy to decide for one subject; `limit` when the code computes it per request."""

    policy: CodePolicy
    subject: Subject
    limit: int | None = None


def subject(canonical: str, display: str | None = None) -> Subject:
    """A subject from the text that identifies it, hashed as subjects.py hashes every subject."""
    return Subject(_hash(canonical), _bounded(canonical if display is None else display))


def decide(request, wants: Sequence[Want], *, now: float | None = None, dry_run: bool = False) -> list[Decision | None]:
    """The decision of each want, in order; None for a policy the operator disabled or an exempt subject.

    One Redis call for all of them, all-or-nothing. Raises engine.RedisUnavailable (already recorded).
    """
    for want in wants:
        registry.ensure_synced(want.policy)  # a class or scope first seen now: its row, then a reload
    index = policies.get_index()
    checks: list[Check] = []
    placed: list[int | None] = []
    for want in wants:
        check = _check(index, request, want)
        placed.append(None if check is None else len(checks))
        if check is not None:
            checks.append(check)
    state = None if dry_run else state_of(request)
    # the middleware left this request's one call to this door: its policies join the call
    pending = limiter.pending_checks(request, state) if state is not None and state.awaiting else []
    if not checks and not pending:
        return [None] * len(wants)
    epoch = deny_cache.epoch  # before Redis is asked (limiter.settle)
    try:
        verdict = engine.decide(pending + checks, now=now, dry_run=dry_run)
    except engine.RedisUnavailable as error:
        if state is not None:
            state.awaiting = False
            limiter.unavailable(request, state, error)
        raise
    if state is None:
        policies.observe_version(verdict.version)
    else:  # kept on the request: the middleware writes the RateLimit headers, metrics and the deny cache see it
        state.awaiting = False
        limiter.settle(request, state, pending + checks, verdict, epoch)
        state.refused = any(not d.allowed for d in verdict.decisions[: len(pending)])
    decisions = verdict.decisions[len(pending) :]
    return [None if at is None else decisions[at] for at in placed]


def refused_by_other_policies(request) -> bool:
    """Whether the request is refused by the site's own policies, deciding them now if the middleware
    left them to this door (a throttle that asks nothing itself still makes the request's one call)."""
    if getattr(request, "__dict__", None) is None:  # DRF's own tests call throttles without a real request
        return False
    state = state_of(request)
    if state.awaiting:
        inner_door(request, (), last=True)
    return state.refused


def _check(index: policies.PolicyIndex, request, want: Want) -> Check | None:
    compiled = next((p for p in index.by_name.get(want.policy.values["action"], ()) if p.name == want.policy.name), None)
    if compiled is None:
        return None  # disabled in the admin (or invalid, which is logged when loading)
    limit = compiled.limit if want.limit is None else want.limit  # a callable rate computes it per request
    override = matching_override(index.overrides.get(compiled.id), request) if index.overrides else None
    if override is not None:
        if override.exempt:
            return None
        limit = override.limit
    return Check(compiled, want.subject, limit)
