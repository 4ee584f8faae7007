"""Plans: the limits a subject gets on several policies at once, by being assigned to a plan.

Assignments match requests as overrides do (overrides.SubjectMatcher: a header value, a user, an
address, a network, a group, the narrowest first, then the older row, until an expiry), so a request
is on at most one plan. Under a policy, an override matching the request wins over the plan; a plan that does not name
the policy leaves the policy's own limit. Resolved from the in-process index: no query, no Redis call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from .models import PlanAssignment, PlanLimit
from .overrides import CompiledOverride, SubjectMatcher


@dataclass(frozen=True, slots=True)
class CompiledPlan:
    id: int
    name: str
    limits: dict[int, int | None]  # policy id -> the plan's limit there (None: exempt)

    def __hash__(self) -> int:
        return self.id


@dataclass(frozen=True, slots=True)
class CompiledAssignment:
    id: int
    plan: CompiledPlan
    expires_at: datetime | None
    description: str  # what it matches, masked, for the admin and the tester

    def active(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


PlanAssignments = SubjectMatcher[CompiledAssignment]


def compile_plans(
    limits: Iterable[PlanLimit], assignments: Iterable[PlanAssignment], members: dict[int, frozenset[int]]
) -> PlanAssignments | None:
    """The assignments of every plan, matched like overrides; None when no one is on a plan."""
    by_plan: dict[int, dict[int, int | None]] = {}
    for row in limits:
        by_plan.setdefault(row.plan_id, {})[row.policy_id] = None if row.exempt else row.limit
    matcher: PlanAssignments = SubjectMatcher()
    plans: dict[int, CompiledPlan] = {}
    for row in assignments:
        plan = plans.get(row.plan_id)
        if plan is None:
            plan = plans[row.plan_id] = CompiledPlan(row.plan_id, row.plan.name, by_plan.get(row.plan_id, {}))
        matcher.add(row, CompiledAssignment(row.pk, plan, row.expires_at, row.matcher_display()), members)
    return matcher if plans else None


def assignment_of(assignments: PlanAssignments | None, request) -> CompiledAssignment | None:
    """The assignment that puts this request on a plan (the first in effect, by precedence), or None."""
    return None if assignments is None else assignments.first_active(request)


def plan_of(assignments: PlanAssignments | None, request) -> CompiledPlan | None:
    """The plan this request is on, or None."""
    found = assignment_of(assignments, request)
    return None if found is None else found.plan


def limit_in_effect(
    limit: int, policy_id: int, override: CompiledOverride | None, plan: CompiledPlan | None
) -> tuple[int | None, str]:
    """The limit under a policy (None: exempt) and the plan that set it ('' when none did): the
    subject's override first, then its plan's limit for that policy, then the policy's `limit`."""
    if override is not None:
        return (None if override.exempt else override.limit), ""
    if plan is not None and policy_id in plan.limits:
        return plan.limits[policy_id], plan.name
    return limit, ""
