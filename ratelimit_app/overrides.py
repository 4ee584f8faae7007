"""Per-subject overrides compiled from their rows for the index. Which one applies to a request (the
precedence, the expiry) is subjects/matching.py's, where a request's subject is resolved."""

from __future__ import annotations

from typing import Iterable

from .models import Override
from .subjects.matching import CompiledOverride, PolicyOverrides, SubjectMatcher, matching_override

__all__ = ["CompiledOverride", "PolicyOverrides", "SubjectMatcher", "compile_override", "compile_overrides",
           "matching_override"]


def compile_override(row: Override) -> CompiledOverride:
    return CompiledOverride(
        row.pk, row.policy_id, row.kind, row.exempt, row.limit, row.expires_at, row.matcher_display()
    )


def compile_overrides(rows: Iterable[Override], members: dict[int, frozenset[int]]) -> dict[int, PolicyOverrides]:
    by_policy: dict[int, PolicyOverrides] = {}
    for row in rows:
        by_policy.setdefault(row.policy_id, SubjectMatcher()).add(row, compile_override(row), members)
    return by_policy
