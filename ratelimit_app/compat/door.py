"""What both compat modules share: decide subjects computed in Python (a DRF cache key, a django-ratelimit
key) under the policies they declared, in one Redis call, with the admin's changes and overrides."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .. import engine, policies, registry
from ..engine import Check, Decision
from ..limiter import outage, state_of
from ..overrides import matching_override
from ..registry import CodePolicy
from ..subjects import Subject, _bounded, _hash


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
    if not checks:
        return [None] * len(wants)
    try:
        verdict = engine.decide(checks, now=now, dry_run=dry_run)
    except engine.RedisUnavailable as error:
        outage.record(error)
        raise
    policies.observe_version(verdict.version)
    if not dry_run:
        state = state_of(request)  # the middleware adds these to the response's RateLimit headers
        state.decided.update(check.policy.id for check in checks)
        state.decisions.extend(verdict.decisions)
    return [None if at is None else verdict.decisions[at] for at in placed]


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
