"""Policies, overrides, action costs and plans as plain JSON data, to review them and move them
between environments.

Rows are identified by natural keys (a policy or a plan by its name, a cost by its action, a user by
username, a group by name), so a file exported on one site imports on another. Importing updates
policies by name and replaces the overrides of every policy in the file, creates or updates the costs
by action (a cost the file does not name stays), and creates or updates plans by name, replacing the
limits and assignments of every plan in the file (a plan the file does not name stays). The whole
file is checked first (its shape, every field's type, then every row as the admin would, then the
rows against each other as they stand once written) and nothing is written unless all of it is good.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.utils.dateparse import parse_datetime

from .models import ActionCost, Override, Plan, PlanAssignment, PlanLimit, Policy, SubjectMatch
from . import strategies
from .periods import PERIODS
from .rates import parse_quota, parse_rate

FORMAT = "ratelimit_app/1"

TEXT, WHOLE, FLAG = "text", "a whole number", "true or false"
LARGEST = 2**31 - 1  # what every database stores in an integer column
# field -> (expected type, may be null)
POLICY_FIELDS: dict[str, tuple[str, bool]] = {
    "name": (TEXT, False), "action": (TEXT, False), "limit": (WHOLE, False), "window": (WHOLE, False),
    "strategy": (TEXT, False), "key": (TEXT, False), "methods": (TEXT, False), "mode": (TEXT, False),
    "enabled": (FLAG, False), "bucket_size": (WHOLE, True), "burst": (WHOLE, True), "description": (TEXT, False),
    "period": (TEXT, False), "time_zone": (TEXT, False),
}
IMPORTED_POLICY_FIELDS = {**POLICY_FIELDS, "rate": (TEXT, False)}  # '100/m' may stand for limit and window
MATCH_FIELDS: dict[str, tuple[str, bool]] = {
    "kind": (TEXT, False), "network": (TEXT, False), "header": (TEXT, False), "value": (TEXT, False), "reason": (TEXT, False),
}
MATCH_REFERENCES: dict[str, tuple[str, bool]] = {"user": (TEXT, True), "group": (TEXT, True), "expires_at": (TEXT, True)}
OVERRIDE_FIELDS: dict[str, tuple[str, bool]] = {**MATCH_FIELDS, "exempt": (FLAG, False), "limit": (WHOLE, True)}
OVERRIDE_REFERENCES = MATCH_REFERENCES
COST_FIELDS: dict[str, tuple[str, bool]] = {"action": (TEXT, False), "cost": (WHOLE, False), "note": (TEXT, False)}
PLAN_FIELDS: dict[str, tuple[str, bool]] = {"name": (TEXT, False), "description": (TEXT, False)}
PLAN_LIMIT_FIELDS: dict[str, tuple[str, bool]] = {"policy": (TEXT, False), "limit": (WHOLE, True), "exempt": (FLAG, False)}
# 'costs' and 'plans' are optional: files exported before them still import
TOP_FIELDS = ("format", "policies", "costs", "plans")


class Oversized(NamedTuple):
    """A whole number in the file too long to be any field's value (kept as its length, not converted)."""

    digits: int


LONGEST = 100  # digits of a whole number converted (and shown in full when out of range); beyond, counted


def _whole_number(text: str) -> int | Oversized:
    digits = len(text.lstrip("-"))
    return Oversized(digits) if digits > LONGEST else int(text)


class Imported(NamedTuple):
    policies: int
    overrides: int
    costs: int
    plans: int = 0
    assignments: int = 0


class ImportRefused(ValueError):
    """The file cannot be imported; the message lists every problem found."""


# --- export -------------------------------------------------------------------------------------


def export_data() -> dict[str, Any]:
    policies = []
    for policy in Policy.objects.prefetch_related("overrides__user", "overrides__group").order_by("name"):
        entry = {name: getattr(policy, name) for name in POLICY_FIELDS}
        entry["overrides"] = [_export_override(o) for o in policy.overrides.all()]
        policies.append(entry)
    costs = [{name: getattr(cost, name) for name in COST_FIELDS} for cost in ActionCost.objects.order_by("action")]
    return {"format": FORMAT, "policies": policies, "costs": costs, "plans": _export_plans()}


def _export_override(override: Override) -> dict[str, Any]:
    return _export_match(override, OVERRIDE_FIELDS)


def _export_match(row: SubjectMatch, fields: dict[str, tuple[str, bool]]) -> dict[str, Any]:
    entry = {name: getattr(row, name) for name in fields}
    entry["user"] = row.user.get_username() if row.user_id else None
    entry["group"] = row.group.name if row.group_id else None
    entry["expires_at"] = row.expires_at.isoformat() if row.expires_at else None
    return entry


def _export_plans() -> list[dict[str, Any]]:
    plans = []
    for plan in Plan.objects.prefetch_related("limits__policy", "assignments__user", "assignments__group").order_by("name"):
        entry: dict[str, Any] = {name: getattr(plan, name) for name in PLAN_FIELDS}
        entry["limits"] = [
            {"policy": row.policy.name, "limit": row.limit, "exempt": row.exempt}
            for row in sorted(plan.limits.all(), key=lambda row: row.policy.name)
        ]
        entry["assignments"] = [_export_match(row, MATCH_FIELDS) for row in plan.assignments.order_by("pk")]
        plans.append(entry)
    return plans


# --- reading a file -----------------------------------------------------------------------------


def parse_json(text: str) -> Any:
    """The file's data; ImportRefused for what is not strict JSON (NaN, Infinity, a repeated key)."""

    def no_constant(name: str) -> None:
        raise ImportRefused(f"{name} is not a number JSON allows.")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in pairs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ImportRefused(f"the field {repeated[0]!r} appears twice in one object.")
        return dict(pairs)

    try:
        # a number of thousands of digits is reported per field, not converted (Python refuses past 4,300)
        return json.loads(text, parse_constant=no_constant, object_pairs_hook=unique_keys, parse_int=_whole_number)
    except json.JSONDecodeError as error:
        raise ImportRefused(f"Not valid JSON: {error}") from error
    except RecursionError:
        # an export is three levels deep; Python's parser gives up near a thousand
        raise ImportRefused("The file is nested too deeply to be a ratelimit_app export.") from None


def _type_problems(where: str, entry: Any, fields: dict[str, tuple[str, bool]], nested: tuple[str, ...] = ()) -> list[str]:
    if not isinstance(entry, dict):
        return [f"{where}: expected an object with fields, got {_kind(entry)}."]
    problems = [
        f"{where}, field {name!r}: unknown field (known: {', '.join([*fields, *nested])})."
        for name in entry
        if name not in fields and name not in nested
    ]
    for name, (expected, nullable) in fields.items():
        value = entry.get(name)
        if expected == WHOLE and isinstance(value, Oversized):
            problems.append(f"{where}, field {name!r}: a number of {value.digits} digits is out of range (at most {LARGEST}).")
        elif name in entry and not _is(value, expected, nullable):
            problems.append(f"{where}, field {name!r}: expected {expected}{' or null' if nullable else ''}, got {_kind(value)}.")
        elif expected == WHOLE and isinstance(value, int) and not -LARGEST <= value <= LARGEST:
            problems.append(f"{where}, field {name!r}: {value} is out of range (at most {LARGEST}).")
        elif expected == TEXT and isinstance(value, str) and "\x00" in value:
            problems.append(f"{where}, field {name!r}: the text contains a NUL character (\\x00), which databases cannot store.")
    return problems


def _is(value: Any, expected: str, nullable: bool) -> bool:
    if value is None:
        return nullable
    if expected == WHOLE:
        return isinstance(value, int) and not isinstance(value, bool)  # 99.99 or true are not limits
    if expected == FLAG:
        return isinstance(value, bool)
    return isinstance(value, str)


def _kind(value: Any) -> str:
    if isinstance(value, Oversized):
        return f"a number of {value.digits} digits"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return "a list" if isinstance(value, list) else "an object"


def shape_problems(data: Any) -> list[str]:
    """Everything wrong with the file's structure and types, row by row and field by field."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return [f"Not a ratelimit_app export: expected {{\"format\": \"{FORMAT}\", \"policies\": [...]}}."]
    problems = [f"field {name!r}: unknown field (known: {', '.join(TOP_FIELDS)})." for name in data if name not in TOP_FIELDS]
    problems += _cost_shape_problems(data.get("costs", []))
    problems += _plan_shape_problems(data.get("plans", []))
    policies = data.get("policies")
    if not isinstance(policies, list):
        return problems + [f"field 'policies': expected a list, got {_kind(policies)}."]
    seen: dict[str, int] = {}
    for number, entry in enumerate(policies, 1):
        where = _policy_label(number, entry)
        problems += _type_problems(where, entry, IMPORTED_POLICY_FIELDS, nested=("overrides",))
        if not isinstance(entry, dict):
            continue
        problems += _unique_problems(where, number, entry, "name", seen, "the name is already used by policy")
        overrides = entry.get("overrides", [])
        if not isinstance(overrides, list):
            problems.append(f"{where}, field 'overrides': expected a list, got {_kind(overrides)}.")
            continue
        for index, item in enumerate(overrides, 1):
            problems += _type_problems(f"{where}, override {index}", item, {**OVERRIDE_FIELDS, **OVERRIDE_REFERENCES})
    return problems


def _cost_shape_problems(costs: Any) -> list[str]:
    if not isinstance(costs, list):
        return [f"field 'costs': expected a list, got {_kind(costs)}."]
    problems = []
    seen: dict[str, int] = {}
    for number, entry in enumerate(costs, 1):
        where = _cost_label(number, entry)
        problems += _type_problems(where, entry, COST_FIELDS)
        if isinstance(entry, dict):
            problems += _unique_problems(where, number, entry, "action", seen, "the action is already priced by cost")
    return problems


def _unique_problems(where: str, number: int, entry: dict, field: str, seen: dict[str, int], taken: str) -> list[str]:
    """`field` is required and unique among the entries of its list (`seen`: value -> entry number)."""
    value = entry.get(field)
    if field not in entry:
        return [f"{where}, field '{field}': required."]
    if isinstance(value, str) and value in seen:
        return [f"{where}, field '{field}': {taken} {seen[value]}."]
    if isinstance(value, str):
        seen[value] = number
    return []


def _plan_shape_problems(plans: Any) -> list[str]:
    if not isinstance(plans, list):
        return [f"field 'plans': expected a list, got {_kind(plans)}."]
    problems = []
    seen: dict[str, int] = {}
    for number, entry in enumerate(plans, 1):
        where = _plan_label(number, entry)
        problems += _type_problems(where, entry, PLAN_FIELDS, nested=("limits", "assignments"))
        if not isinstance(entry, dict):
            continue
        problems += _unique_problems(where, number, entry, "name", seen, "the name is already used by plan")
        for nested, what, fields in (
            ("limits", "limit", PLAN_LIMIT_FIELDS), ("assignments", "assignment", {**MATCH_FIELDS, **MATCH_REFERENCES})
        ):
            items = entry.get(nested, [])
            if not isinstance(items, list):
                problems.append(f"{where}, field {nested!r}: expected a list, got {_kind(items)}.")
                continue
            for index, item in enumerate(items, 1):
                problems += _type_problems(f"{where}, {what} {index}", item, fields)
                if nested == "limits" and isinstance(item, dict) and "policy" not in item:
                    problems.append(f"{where}, {what} {index}, field 'policy': required.")
    return problems


def _plan_label(number: int, entry: Any) -> str:
    name = entry.get("name") if isinstance(entry, dict) else None
    return f"plan {number} ({name!r})" if isinstance(name, str) else f"plan {number}"


def _cost_label(number: int, entry: Any) -> str:
    action = entry.get("action") if isinstance(entry, dict) else None
    return f"cost {number} ({action!r})" if isinstance(action, str) else f"cost {number}"


def _policy_label(number: int, entry: Any) -> str:
    name = entry.get("name") if isinstance(entry, dict) else None
    return f"policy {number} ({name!r})" if isinstance(name, str) else f"policy {number}"


# --- import -------------------------------------------------------------------------------------


@transaction.atomic
def import_data(data: Any) -> Imported:
    """Create or update the policies of `data` and replace their overrides, create or update its
    action costs, create or update its plans and replace their limits and assignments; returns how
    many of each were imported."""
    problems = shape_problems(data)
    if problems:
        raise ImportRefused("Nothing was imported:\n" + "\n".join(f"- {p}" for p in problems))
    imported_policies = imported_overrides = 0
    written: list[tuple[str, Policy | ActionCost]] = []  # checked against each other once all are written
    for number, entry in enumerate(data["policies"], 1):
        where = _policy_label(number, entry)
        policy = Policy.objects.filter(name=entry["name"]).first() or Policy()
        for field in POLICY_FIELDS:
            if field in entry:
                setattr(policy, field, entry[field])
        quota = parse_quota(entry.get("rate"))
        if quota:  # '10000/month': a calendar quota
            policy.limit, policy.period = quota
            policy.window, policy.strategy = PERIODS[quota[1]], strategies.calendar()
        elif "rate" in entry:  # '100/m' instead of limit and window
            try:
                policy.limit, policy.window = parse_rate(entry["rate"])
            except ValueError as error:
                problems.append(f"{where}, field 'rate': {error}")
                continue
        # whether its limit admits the costs is checked below, against the costs of this file too
        if not _valid(policy, where, problems) or not _saved(policy, where, problems):
            continue
        written.append((where, policy))
        imported_policies += 1
        policy.overrides.all().delete()
        for index, item in enumerate(entry.get("overrides", []), 1):
            try:
                override = _import_override(policy, item)
            except (ValidationError, LookupError) as error:
                problems.append(f"{where}, override {index}: {_messages(error)}")
                continue
            imported_overrides += _saved(override, f"{where}, override {index}", problems)
    for number, entry in enumerate(data.get("costs", []), 1):
        where = _cost_label(number, entry)
        cost = ActionCost.objects.filter(action=entry["action"]).first() or ActionCost()
        for field in COST_FIELDS:
            if field in entry:
                setattr(cost, field, entry[field])
        if not _valid(cost, where, problems) or not _saved(cost, where, problems):
            continue
        written.append((where, cost))
    plans, assignments = _import_plans(data.get("plans", []), problems)
    # a cost and a limit are judged as the file leaves them, whichever of the two it changes first
    for where, row in written:
        try:
            row.validate_constraints()
        except ValidationError as error:
            problems.append(f"{where}: {_messages(error)}")
    if problems:
        transaction.set_rollback(True)
        raise ImportRefused("Nothing was imported:\n" + "\n".join(f"- {p}" for p in problems))
    costs = sum(isinstance(row, ActionCost) for _, row in written)
    return Imported(imported_policies, imported_overrides, costs, plans, assignments)


def _import_plans(entries: list[dict[str, Any]], problems: list[str]) -> tuple[int, int]:
    """Create or update each plan by name and replace its limits and assignments (the policies named
    may be the file's own, written before); returns how many plans and assignments were written."""
    plans = assignments = 0
    for number, entry in enumerate(entries, 1):
        where = _plan_label(number, entry)
        plan = Plan.objects.filter(name=entry["name"]).first() or Plan()
        for field in PLAN_FIELDS:
            if field in entry:
                setattr(plan, field, entry[field])
        if not _valid(plan, where, problems) or not _saved(plan, where, problems):
            continue
        plans += 1
        plan.limits.all().delete()
        plan.assignments.all().delete()
        for index, item in enumerate(entry.get("limits", []), 1):
            try:
                row = PlanLimit(plan=plan, policy=_lookup(Policy.objects, name=item["policy"]), exempt=item.get("exempt", False))
                row.limit = item.get("limit")
                row.full_clean()
            except (ValidationError, LookupError) as error:
                problems.append(f"{where}, limit {index}: {_messages(error)}")
                continue
            _saved(row, f"{where}, limit {index}", problems)
        for index, item in enumerate(entry.get("assignments", []), 1):
            try:
                assignment = _matching(PlanAssignment(plan=plan), item, MATCH_FIELDS)
            except (ValidationError, LookupError) as error:
                problems.append(f"{where}, assignment {index}: {_messages(error)}")
                continue
            assignments += _saved(assignment, f"{where}, assignment {index}", problems)
    return plans, assignments


def _valid(row, where: str, problems: list[str]) -> bool:
    """Whether `row` passes the admin's checks of its own fields (rows are checked against each other
    once the whole file is written); its problems are added to `problems` when not."""
    try:
        row.full_clean(validate_constraints=False)
    except ValidationError as error:
        problems.append(f"{where}: {_messages(error)}")
        return False
    return True


def _saved(row, where: str, problems: list[str]) -> bool:
    """Save `row` in a savepoint: a value the database refuses although it passed the checks is a
    problem of its entry (the import goes on collecting them), never a traceback."""
    try:
        with transaction.atomic():
            row.save()
    except DatabaseError as error:
        problems.append(f"{where}: the database refused it: {str(error).strip()}")
        return False
    return True


def _import_override(policy: Policy, item: dict[str, Any]) -> Override:
    return _matching(Override(policy=policy), item, OVERRIDE_FIELDS)


def _matching(row: SubjectMatch, item: dict[str, Any], fields: dict[str, tuple[str, bool]]) -> Any:
    """`row` (an override, an assignment) with the fields of `item` and what they name, checked."""
    for name in fields:
        if name in item:
            setattr(row, name, item[name])
    if item.get("user"):
        row.user = _lookup(get_user_model().objects, **{get_user_model().USERNAME_FIELD: item["user"]})
    if item.get("group"):
        row.group = _lookup(Group.objects, name=item["group"])
    row.expires_at = _moment(item.get("expires_at"))
    row.full_clean()
    return row


def _moment(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = parse_datetime(value)
    except ValueError:
        moment = None
    if moment is None:
        raise ValidationError({"expires_at": f"{value[:40]!r} is not a date and time such as 2030-01-31T12:00:00+00:00."})
    return moment


def _lookup(manager, **criteria):
    found = manager.filter(**criteria).first()
    if found is None:
        raise LookupError(f"no {manager.model._meta.verbose_name} {next(iter(criteria.values()))!r} here")
    return found


def _messages(error: Exception) -> str:
    if isinstance(error, ValidationError) and hasattr(error, "message_dict"):
        return "; ".join(f"field {field!r}: {' '.join(msgs)}" for field, msgs in error.message_dict.items())
    return str(error.args[0] if error.args else error)
