"""From the database rows (and the code's declarations) to what the request path reads: a policy row
compiled, and every row the policy index holds read at once."""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict
from typing import NamedTuple

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from . import registry, strategies
from .models import ActionCost, Mode, Override, PlanAssignment, PlanLimit, Policy
from .overrides import PolicyOverrides, compile_overrides
from .plans import PlanAssignments, compile_plans
from .subjects import parse_key_spec
from .values import REQUESTS, CompiledPolicy

logger = logging.getLogger("ratelimit_app")


def with_head(methods: frozenset[str]) -> frozenset[str]:
    """HEAD is GET: Django answers HEAD with the GET view, so a GET policy counts it too."""
    return methods | {"HEAD"} if "GET" in methods else methods


def compile_policy(row: Policy) -> CompiledPolicy:
    """Validate a row (as the admin would) and compile it; raises ValidationError for a bad row."""
    row.full_clean(validate_unique=False, validate_constraints=False)
    strategy = strategies.get(row.strategy)
    key_spec = parse_key_spec(row.key)
    bucket_ms = strategy.bucket_ms(row)
    period, time_zone = strategy.period_kind(row)
    return CompiledPolicy(
        id=row.pk,
        name=row.name,
        action=row.action,
        limit=row.limit,
        window=row.window,
        strategy=row.strategy,
        key=row.key,
        key_spec=key_spec,
        methods=with_head(row.methods_set),
        mode=row.mode,
        bucket_size=row.bucket_size,
        generation=row.generation,
        burst=strategy.burst(row),
        window_ms=row.window * 1000,
        bucket_ms=bucket_ms,
        shape=strategy.shape(row, bucket_ms) + unit_part(row.unit),
        enforce=row.mode == Mode.ENFORCE,
        totals_bucket_ms=strategy.totals_bucket_ms(row.window * 1000, bucket_ms),
        counts_users=any(part.reads_user for part in key_spec),
        holds=strategy.holds,
        most=strategy.most,
        period=period,
        time_zone=time_zone,
        plugin=strategy if strategy.asked else None,
        unit=row.unit,
        meters=row.unit != REQUESTS,
        overage_cap=row.overage_cap,
    )


def unit_part(unit: str) -> str:
    """What a counter key adds for a metered unit: counters of another unit are not read as its own (900
    tokens are no 900 requests), and a settle sent after the change moves a counter no longer read."""
    return "" if unit == REQUESTS else f"~{zlib.crc32(unit.encode()) % 1679616:x}"


class Rows(NamedTuple):
    """What the policy index is built from (policies.PolicyIndex takes them in this order)."""

    policies: list[CompiledPolicy]
    overrides: dict[int, PolicyOverrides]
    costs: dict[str, int]
    plans: PlanAssignments | None


def read_rows() -> Rows:
    """Read the enabled policies, their overrides, the action costs and the plans; a bad row is
    skipped with a logged error. A policy declared in code whose row is not in the database (yet) is
    enforced as the code declares it: a row, once there, wins (the operator's changes, or disabling it)."""
    rows = list(Policy.objects.order_by("pk"))
    names = {row.name for row in rows}
    unwritten = [policy for policy in registry.declared_policies() if policy.name not in names]
    if unwritten:
        registry.not_written(unwritten)
    compiled = []
    for row in rows + [registry.unsaved_row(policy) for policy in unwritten]:
        if not row.enabled:
            continue
        try:
            compiled.append(compile_policy(row))
        except (ValidationError, ValueError, KeyError) as error:
            logger.error("ratelimit: policy %r (id %s) is invalid and is skipped: %s", row.name, row.pk, error)
    ids = {policy.id for policy in compiled if policy.id > 0}  # a declaration without its row has none
    return Rows(compiled, _load_overrides(ids), _load_costs(), _load_plans(ids))


def _load_costs() -> dict[str, int]:
    costs = {}
    for row in ActionCost.objects.order_by("pk"):
        try:
            # the fields only: a cost over some policy's capacity still counts (the engine refuses such a request)
            row.full_clean(validate_unique=False, validate_constraints=False)
        except ValidationError as error:
            logger.error("ratelimit: action cost %r (id %s) is invalid and is skipped: %s", row.action, row.pk, error)
            continue
        costs[row.action] = row.cost
    return costs


def _logged(described: str, error: ValidationError) -> None:
    logger.error("ratelimit: %s is invalid and is skipped: %s", described, error)


def _valid(rows, exclude: list[str], described, refused=_logged) -> list:
    """The rows that pass validation (the relations are the loader's own); each other one is handed to
    `refused` (logged) and skipped."""
    kept = []
    for row in rows:
        try:
            row.full_clean(exclude=exclude, validate_unique=False, validate_constraints=False)
            kept.append(row)
        except ValidationError as error:
            refused(described(row), error)
    return kept


# the rows of each kind as the index reads them, what is left to the loader, and how a bad one is named
OVERRIDES = (("policy", "user", "group"), lambda row: f"override id {row.pk} of policy {row.policy.name!r}")
ASSIGNMENTS = (("plan", "user", "group"), lambda row: f"assignment id {row.pk} to plan {row.plan.name!r}")
PLAN_LIMITS = (("plan", "policy"), lambda row: f"limit id {row.pk} of plan {row.plan.name!r}")
# between rows of equal rank the older wins: by creation, which an import carries over, then by pk
OLDEST_FIRST = ("created", "pk")


def _load_overrides(policy_ids: set[int]) -> dict[int, PolicyOverrides]:
    found = Override.objects.filter(policy_id__in=policy_ids).select_related(*OVERRIDES[0]).order_by(*OLDEST_FIRST)
    rows = _valid(found, [*OVERRIDES[0]], OVERRIDES[1])
    return compile_overrides(rows, _members({row.group_id for row in rows if row.group_id}))


def _load_plans(policy_ids: set[int]) -> PlanAssignments | None:
    found = PlanAssignment.objects.select_related(*ASSIGNMENTS[0]).order_by(*OLDEST_FIRST)
    assignments = _valid(found, [*ASSIGNMENTS[0]], ASSIGNMENTS[1])
    if not assignments:
        return None  # most sites sell nothing: no plan limit is read either
    found = PlanLimit.objects.filter(policy_id__in=policy_ids).select_related(*PLAN_LIMITS[0]).order_by("pk")
    limits = _valid(found, [*PLAN_LIMITS[0]], PLAN_LIMITS[1])
    return compile_plans(limits, assignments, _members({row.group_id for row in assignments if row.group_id}))


def invalid_rows() -> list[tuple[str, ValidationError]]:
    """The overrides, plan assignments and plan limits that reading the index skips, each named with
    why (the system checks report them: a row written past the admin's validation matches nothing)."""
    found: list[tuple[str, ValidationError]] = []
    for model, (related, described) in ((Override, OVERRIDES), (PlanAssignment, ASSIGNMENTS), (PlanLimit, PLAN_LIMITS)):
        rows = model.objects.select_related(*related).order_by("pk")
        _valid(rows, [*related], described, lambda name, error: found.append((name, error)))
    return found


def _members(group_ids: set[int]) -> dict[int, frozenset[int]]:
    """The users of each group: group id -> their ids."""
    members: dict[int, set[int]] = defaultdict(set)
    if group_ids:
        memberships = get_user_model().groups.through.objects.filter(group_id__in=group_ids)
        for group_id, user_id in memberships.values_list("group_id", get_user_model()._meta.model_name + "_id"):
            members[group_id].add(user_id)
    return {group_id: frozenset(users) for group_id, users in members.items()}
