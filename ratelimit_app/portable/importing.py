"""Importing: policies and plans by name, costs by action, replacing the overrides, limits and assignments of
what the file names (what it does not name stays). The file is checked whole first; nothing is written unless
all of it is good."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Iterator, NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.utils.dateparse import parse_datetime

from .. import strategies
from ..models import ActionCost, Override, Plan, PlanAssignment, PlanLimit, Policy, SubjectMatch
from ..periods import PERIODS
from ..rates import not_a_period, parse_quota, parse_rate
from ..values import REQUESTS
from .shape import (
    COST_FIELDS,
    MATCH_FIELDS,
    OVERRIDE_FIELDS,
    PLAN_FIELDS,
    POLICY_FIELDS,
    ImportRefused,
    cost_label,
    plan_label,
    policy_label,
    shape_problems,
)


class Imported(NamedTuple):
    policies: int
    overrides: int
    costs: int
    plans: int = 0
    assignments: int = 0


@transaction.atomic
def import_data(data: Any) -> Imported:
    """Create or update the policies of `data` and replace their overrides, create or update its
    action costs, create or update its plans and replace their limits and assignments; returns how
    many of each were imported."""
    problems = shape_problems(data)
    if problems:
        raise ImportRefused("Nothing was imported:\n" + "\n".join(f"- {p}" for p in problems))
    written: list[tuple[str, Policy | ActionCost]] = []  # checked against each other once all are written
    policies, overrides = _import_policies(data["policies"], written, problems)
    costs = _import_costs(data.get("costs", []), written, problems)
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
    return Imported(policies, overrides, costs, plans, assignments)


def _import_policies(entries: list[dict[str, Any]], written: list, problems: list[str]) -> tuple[int, int]:
    """Create or update each policy by name and replace its overrides; returns how many policies and
    overrides were written (the policies are added to `written`)."""
    policies = overrides = 0
    for number, entry in enumerate(entries, 1):
        where = policy_label(number, entry)
        policy = Policy.objects.filter(name=entry["name"]).first() or Policy()
        for field in POLICY_FIELDS:
            if field in entry:
                setattr(policy, field, entry[field])
        if "unit" not in entry and ("limit" in entry or "rate" in entry):
            # its limit is in requests, as every file written before units existed says them
            policy.unit, policy.overage_cap = REQUESTS, entry.get("overage_cap")
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
            if policy.strategy == strategies.calendar():  # it would set the window from the period
                problems.append(f"{where}, field 'rate': {not_a_period(entry['rate'])}")
                continue
        # whether its limit admits the costs is checked once the whole file is written
        if not _valid(policy, where, problems) or not _saved(policy, where, problems):
            continue
        written.append((where, policy))
        policies += 1
        made = lambda item: _matching(Override(policy=policy), item, OVERRIDE_FIELDS)  # noqa: E731
        overrides += _replaced(policy.overrides.all(), entry.get("overrides", []), made, f"{where}, override", problems)
    return policies, overrides


def _import_costs(entries: list[dict[str, Any]], written: list, problems: list[str]) -> int:
    """Create or update each action cost by action (a cost the file does not name stays); returns how
    many were written (and adds them to `written`)."""
    costs = 0
    for number, entry in enumerate(entries, 1):
        where = cost_label(number, entry)
        cost = ActionCost.objects.filter(action=entry["action"]).first() or ActionCost()
        for field in COST_FIELDS:
            if field in entry:
                setattr(cost, field, entry[field])
        if _valid(cost, where, problems) and _saved(cost, where, problems):
            written.append((where, cost))
            costs += 1
    return costs


def _import_plans(entries: list[dict[str, Any]], problems: list[str]) -> tuple[int, int]:
    """Create or update each plan by name and replace its limits and assignments (the policies named
    may be the file's own, written before); returns how many plans and assignments were written."""
    plans = assignments = 0
    for number, entry in enumerate(entries, 1):
        where = plan_label(number, entry)
        plan = Plan.objects.filter(name=entry["name"]).first() or Plan()
        for field in PLAN_FIELDS:
            if field in entry:
                setattr(plan, field, entry[field])
        if not _valid(plan, where, problems) or not _saved(plan, where, problems):
            continue
        plans += 1
        plan.limits.all().delete()
        _each_saved(entry.get("limits", []), lambda item: _plan_limit(plan, item), f"{where}, limit", problems)
        made = lambda item: _matching(PlanAssignment(plan=plan), item, MATCH_FIELDS)  # noqa: E731
        assignments += _replaced(
            plan.assignments.all(), entry.get("assignments", []), made, f"{where}, assignment", problems
        )
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


def _plan_limit(plan: Plan, item: dict[str, Any]) -> PlanLimit:
    row = PlanLimit(plan=plan, policy=_lookup(Policy.objects, name=item["policy"]), exempt=item.get("exempt", False))
    row.limit = item.get("limit")
    row.full_clean()
    return row


def _made(items: list, make: Callable[[Any], Any], label: str, problems: list[str]) -> Iterator[tuple[str, Any]]:
    """Each row `make` builds from `items`, with its place ('override 2'); an item it refuses is a problem."""
    for index, item in enumerate(items, 1):
        try:
            yield f"{label} {index}", make(item)
        except (ValidationError, LookupError) as error:
            problems.append(f"{label} {index}: {_messages(error)}")


def _each_saved(items: list, make: Callable[[Any], Any], label: str, problems: list[str]) -> int:
    """Save the row `make` builds from each item; an item it refuses is a problem named by its place."""
    return sum(_saved(row, place, problems) for place, row in _made(items, make, label, problems))


def _replaced(existing, items: list, make: Callable[[Any], Any], label: str, problems: list[str]) -> int:
    """Save the rows `make` builds from `items` in place of the `existing` ones (a policy's overrides, a
    plan's assignments); returns how many were saved. A row matching the same subject as an existing one
    updates it: it keeps its id and its age, which decide between equals, unless the file gives its age."""
    by_subject: dict[tuple, list] = {}
    for old in existing.order_by("pk"):
        by_subject.setdefault(_subject(old), []).append(old)
    saved = 0
    for place, row in _made(items, make, label, problems):
        olds = by_subject.get(_subject(row))
        if olds:
            same = olds.pop(0)
            row.pk, row.created = same.pk, row.created or same.created
        given = row.created  # a new row is stamped now by save(): the file's creation is written after
        if _saved(row, place, problems):
            saved += 1
            if given and row.created != given:
                type(row).objects.filter(pk=row.pk).update(created=given)
    left = [old.pk for olds in by_subject.values() for old in olds]
    for start in range(0, len(left), 500):  # within every database's limit of query parameters
        existing.filter(pk__in=left[start : start + 500]).delete()
    return saved


def _subject(row: SubjectMatch) -> tuple:
    return row.kind, row.user_id, row.group_id, row.network, row.header, row.value


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


def _matching(row: SubjectMatch, item: dict[str, Any], fields: dict[str, tuple[str, bool]]) -> Any:
    """`row` (an override, an assignment) with the fields of `item` and what they name, checked."""
    for name in fields:
        if name in item:
            setattr(row, name, item[name])
    if item.get("user"):
        row.user = _lookup(get_user_model().objects, **{get_user_model().USERNAME_FIELD: item["user"]})
    if item.get("group"):
        row.group = _lookup(Group.objects, name=item["group"])
    row.expires_at = _moment(item.get("expires_at"), "expires_at")
    row.created = _moment(item.get("created"), "created")  # absent from files exported before it
    row.full_clean()
    return row


def _moment(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        moment = parse_datetime(value)
    except ValueError:
        moment = None
    if moment is None:
        said = f"{value[:40]!r} is not a date and time such as 2030-01-31T12:00:00+00:00."
        raise ValidationError({field: said})
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
