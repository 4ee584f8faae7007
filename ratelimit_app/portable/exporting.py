"""Exporting: every policy with its overrides, every action cost and every plan, by natural keys."""

from __future__ import annotations

from typing import Any

from ..models import ActionCost, Plan, Policy, SubjectMatch
from .shape import COST_FIELDS, FORMAT, MATCH_FIELDS, OVERRIDE_FIELDS, PLAN_FIELDS, POLICY_FIELDS


def export_data() -> dict[str, Any]:
    """The whole configuration as the file's data (json.dumps writes it)."""
    policies = []
    for policy in Policy.objects.prefetch_related("overrides__user", "overrides__group").order_by("name"):
        entry = {name: getattr(policy, name) for name in POLICY_FIELDS}
        entry["overrides"] = [_export_match(o, OVERRIDE_FIELDS) for o in policy.overrides.all()]
        policies.append(entry)
    costs = [{name: getattr(cost, name) for name in COST_FIELDS} for cost in ActionCost.objects.order_by("action")]
    return {"format": FORMAT, "policies": policies, "costs": costs, "plans": _export_plans()}


def _export_match(row: SubjectMatch, fields: dict[str, tuple[str, bool]]) -> dict[str, Any]:
    entry = {name: getattr(row, name) for name in fields}
    entry["user"] = row.user.get_username() if row.user_id else None
    entry["group"] = row.group.name if row.group_id else None
    entry["expires_at"] = row.expires_at.isoformat() if row.expires_at else None
    entry["created"] = row.created.isoformat()  # the older of two equal rows wins: its age travels with it
    return entry


def _export_plans() -> list[dict[str, Any]]:
    plans = []
    rows = Plan.objects.prefetch_related("limits__policy", "assignments__user", "assignments__group")
    for plan in rows.order_by("name"):
        entry: dict[str, Any] = {name: getattr(plan, name) for name in PLAN_FIELDS}
        entry["limits"] = [
            {"policy": row.policy.name, "limit": row.limit, "exempt": row.exempt}
            for row in sorted(plan.limits.all(), key=lambda row: row.policy.name)
        ]
        entry["assignments"] = [_export_match(row, MATCH_FIELDS) for row in plan.assignments.order_by("pk")]
        plans.append(entry)
    return plans

