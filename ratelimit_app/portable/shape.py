"""The export file's format, and everything wrong with a file's shape: strict JSON, known fields, each
field's type, required and unique names; each problem names its row and field."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

FORMAT = "ratelimit_app/1"

TEXT, WHOLE, FLAG = "text", "a whole number", "true or false"
LARGEST = 2**31 - 1  # what every database stores in an integer column
# field -> (expected type, may be null)
POLICY_FIELDS: dict[str, tuple[str, bool]] = {
    "name": (TEXT, False), "action": (TEXT, False), "limit": (WHOLE, False), "window": (WHOLE, False),
    "strategy": (TEXT, False), "key": (TEXT, False), "methods": (TEXT, False), "mode": (TEXT, False),
    "enabled": (FLAG, False), "bucket_size": (WHOLE, True), "burst": (WHOLE, True), "description": (TEXT, False),
    "period": (TEXT, False), "time_zone": (TEXT, False), "unit": (TEXT, False),
    "overage_cap": (WHOLE, True),
}
IMPORTED_POLICY_FIELDS = {**POLICY_FIELDS, "rate": (TEXT, False)}  # '100/m' may stand for limit and window
MATCH_FIELDS: dict[str, tuple[str, bool]] = {
    "kind": (TEXT, False), "network": (TEXT, False), "header": (TEXT, False), "value": (TEXT, False),
    "reason": (TEXT, False),
}
MATCH_REFERENCES: dict[str, tuple[str, bool]] = {
    "user": (TEXT, True), "group": (TEXT, True), "expires_at": (TEXT, True), "created": (TEXT, True),
}
OVERRIDE_FIELDS: dict[str, tuple[str, bool]] = {**MATCH_FIELDS, "exempt": (FLAG, False), "limit": (WHOLE, True)}
OVERRIDE_REFERENCES = MATCH_REFERENCES
COST_FIELDS: dict[str, tuple[str, bool]] = {"action": (TEXT, False), "cost": (WHOLE, False), "note": (TEXT, False)}
PLAN_FIELDS: dict[str, tuple[str, bool]] = {"name": (TEXT, False), "description": (TEXT, False)}
PLAN_LIMIT_FIELDS: dict[str, tuple[str, bool]] = {
    "policy": (TEXT, False), "limit": (WHOLE, True), "exempt": (FLAG, False),
}
# 'costs' and 'plans' are optional: files exported before them still import
TOP_FIELDS = ("format", "policies", "costs", "plans")


class Oversized(NamedTuple):
    """A whole number in the file too long to be any field's value (kept as its length, not converted)."""

    digits: int


LONGEST = 100  # digits of a whole number converted (and shown in full when out of range); beyond, counted


def _whole_number(text: str) -> int | Oversized:
    digits = len(text.lstrip("-"))
    return Oversized(digits) if digits > LONGEST else int(text)


class ImportRefused(ValueError):
    """The file cannot be imported; the message lists every problem found."""


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


def _type_problems(
    where: str, entry: Any, fields: dict[str, tuple[str, bool]], nested: tuple[str, ...] = ()
) -> list[str]:
    if not isinstance(entry, dict):
        return [f"{where}: expected an object with fields, got {_kind(entry)}."]
    problems = [
        f"{where}, field {name!r}: unknown field (known: {', '.join([*fields, *nested])})."
        for name in entry
        if name not in fields and name not in nested
    ]
    for name, (expected, nullable) in fields.items():
        value, field = entry.get(name), f"{where}, field {name!r}"
        if expected == WHOLE and isinstance(value, Oversized):
            problems.append(f"{field}: a number of {value.digits} digits is out of range (at most {LARGEST}).")
        elif name in entry and not _is(value, expected, nullable):
            problems.append(f"{field}: expected {expected}{' or null' if nullable else ''}, got {_kind(value)}.")
        elif expected == WHOLE and isinstance(value, int) and not -LARGEST <= value <= LARGEST:
            problems.append(f"{field}: {value} is out of range (at most {LARGEST}).")
        elif expected == TEXT and isinstance(value, str) and "\x00" in value:
            problems.append(f"{field}: the text contains a NUL character (\\x00), which databases cannot store.")
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
    known = ", ".join(TOP_FIELDS)
    problems = [f"field {name!r}: unknown field (known: {known})." for name in data if name not in TOP_FIELDS]
    problems += _cost_shape_problems(data.get("costs", []))
    problems += _plan_shape_problems(data.get("plans", []))
    policies = data.get("policies")
    if not isinstance(policies, list):
        return problems + [f"field 'policies': expected a list, got {_kind(policies)}."]
    seen: dict[str, int] = {}
    for number, entry in enumerate(policies, 1):
        where = policy_label(number, entry)
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
        where = cost_label(number, entry)
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
        where = plan_label(number, entry)
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


def plan_label(number: int, entry: Any) -> str:
    name = entry.get("name") if isinstance(entry, dict) else None
    return f"plan {number} ({name!r})" if isinstance(name, str) else f"plan {number}"


def cost_label(number: int, entry: Any) -> str:
    action = entry.get("action") if isinstance(entry, dict) else None
    return f"cost {number} ({action!r})" if isinstance(action, str) else f"cost {number}"


def policy_label(number: int, entry: Any) -> str:
    name = entry.get("name") if isinstance(entry, dict) else None
    return f"policy {number} ({name!r})" if isinstance(name, str) else f"policy {number}"

