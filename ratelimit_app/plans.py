"""Plans: the limits a subject gets on several policies at once, by being assigned to a plan.

Assignments match requests as overrides do (subjects.matching.SubjectMatcher: a header value, a user, an
address, a network, a group, the narrowest first, then the older row, until an expiry), so a request
is on at most one plan. Under a policy, an override matching the request wins over the plan; a plan that does not name
the policy leaves the policy's own limit. Resolved from the in-process index: no query, no Redis call.
The rows are compiled here; the matching and the limit in effect are subjects/matching.py's.
"""

from __future__ import annotations

from typing import Iterable

from .models import PlanAssignment, PlanLimit
from .subjects.matching import (
    CompiledAssignment, CompiledPlan, InEffect, PlanAssignments, RequestLimits, SubjectMatcher, assignment_of,
    limit_in_effect, limits_of, plan_of,
)

__all__ = ["CompiledAssignment", "CompiledPlan", "InEffect", "PlanAssignments", "RequestLimits", "assignment_of",
           "compile_plans", "limit_in_effect", "limits_of", "plan_of"]


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
