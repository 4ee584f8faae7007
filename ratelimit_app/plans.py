"""Plans: the limits a subject gets on several policies at once, by being assigned to a plan.

Assignments match requests as overrides do (overrides.SubjectMatcher: a header value, a user, an
address, a network, a group, the narrowest first, then the older row, until an expiry), so a request
is on at most one plan. Under a policy, an override matching the request wins over the plan; a plan that does not name
the policy leaves the policy's own limit. Resolved from the in-process index: no query, no Redis call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, NamedTuple

from .models import PlanAssignment, PlanLimit
from .overrides import CompiledOverride, PolicyOverrides, SubjectMatcher, matching_override


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


class InEffect(NamedTuple):
    """The limit under one policy for one request, and what set it."""

    limit: int | None  # None: exempt
    plan: str  # the plan that set it, '' when none did
    override: CompiledOverride | None  # the override that set it, None when none did


class RequestLimits:
    """What sets one request's limits besides its policies: its plan, and the overrides of each policy.
    Made once a request (policies.PolicyIndex.limits_for); `of` then answers for each of its policies."""

    __slots__ = ("request", "overrides", "plan")

    def __init__(self, request, overrides: dict[int, PolicyOverrides], plan: CompiledPlan | None) -> None:
        self.request = request
        self.overrides = overrides
        self.plan = plan

    def of(self, policy_id: int, limit: int) -> InEffect:
        """The limit under a policy whose own is `limit`: the subject's override first, then its plan's
        limit for that policy, then the policy's."""
        override = matching_override(self.overrides.get(policy_id), self.request)
        if override is not None:
            return InEffect(None if override.exempt else override.limit, "", override)
        plan = self.plan
        if plan is not None and policy_id in plan.limits:
            return InEffect(plan.limits[policy_id], plan.name, None)
        return InEffect(limit, "", None)


def limit_in_effect(limits: RequestLimits | None, policy_id: int, limit: int) -> InEffect:
    """The limit under a policy whose own is `limit`, for a request whose `limits` are these (None:
    nothing but its policies sets them)."""
    return InEffect(limit, "", None) if limits is None else limits.of(policy_id, limit)
