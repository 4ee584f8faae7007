"""Policies and overrides as plain JSON data, to review them and move them between environments.

Rows are identified by natural keys (a policy by its name, a user by username, a group by name), so
a file exported on one site imports on another. Importing updates policies by name and replaces
the overrides of every policy in the file; it validates everything before writing anything.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction

from .models import Override, Policy
from .rates import parse_rate

FORMAT = "ratelimit_app/1"
POLICY_FIELDS = ("name", "action", "limit", "window", "strategy", "key", "methods", "mode", "enabled", "bucket_size", "burst", "description")
OVERRIDE_FIELDS = ("kind", "network", "header", "value", "exempt", "limit", "reason")


def export_data() -> dict[str, Any]:
    policies = []
    for policy in Policy.objects.prefetch_related("overrides__user", "overrides__group").order_by("name"):
        entry = {name: getattr(policy, name) for name in POLICY_FIELDS}
        entry["overrides"] = [_export_override(o) for o in policy.overrides.all()]
        policies.append(entry)
    return {"format": FORMAT, "policies": policies}


def _export_override(override: Override) -> dict[str, Any]:
    entry = {name: getattr(override, name) for name in OVERRIDE_FIELDS}
    entry["user"] = override.user.get_username() if override.user_id else None
    entry["group"] = override.group.name if override.group_id else None
    entry["expires_at"] = override.expires_at.isoformat() if override.expires_at else None
    return entry


class ImportRefused(ValueError):
    """The file cannot be imported; the message lists every problem found."""


@transaction.atomic
def import_data(data: dict[str, Any]) -> tuple[int, int]:
    """Create or update the policies of `data` and replace their overrides; returns (policies, overrides)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportRefused(f"Not a ratelimit_app export: expected {{'format': '{FORMAT}', 'policies': [...]}}.")
    problems: list[str] = []
    imported_policies = imported_overrides = 0
    for entry in data.get("policies", []):
        name = entry.get("name", "?")
        policy = Policy.objects.filter(name=name).first() or Policy()
        for field in POLICY_FIELDS:
            if field in entry:
                setattr(policy, field, entry[field])
        if "rate" in entry:  # '100/m' instead of limit and window
            try:
                policy.limit, policy.window = parse_rate(entry["rate"])
            except ValueError as error:
                problems.append(f"policy {name!r}: rate: {error}")
                continue
        try:
            policy.full_clean()
        except ValidationError as error:
            problems.append(f"policy {name!r}: {_messages(error)}")
            continue
        policy.save()
        imported_policies += 1
        policy.overrides.all().delete()
        for index, item in enumerate(entry.get("overrides", [])):
            try:
                _import_override(policy, item).save()
                imported_overrides += 1
            except (ValidationError, LookupError) as error:
                problems.append(f"policy {name!r}, override {index + 1}: {_messages(error)}")
    if problems:
        transaction.set_rollback(True)
        raise ImportRefused("Nothing was imported:\n" + "\n".join(f"- {p}" for p in problems))
    return imported_policies, imported_overrides


def _import_override(policy: Policy, item: dict[str, Any]) -> Override:
    override = Override(policy=policy, **{name: item[name] for name in OVERRIDE_FIELDS if name in item})
    if item.get("user"):
        override.user = _lookup(get_user_model().objects, **{get_user_model().USERNAME_FIELD: item["user"]})
    if item.get("group"):
        override.group = _lookup(Group.objects, name=item["group"])
    override.expires_at = item.get("expires_at")
    override.full_clean()
    return override


def _lookup(manager, **criteria):
    found = manager.filter(**criteria).first()
    if found is None:
        raise LookupError(f"no {manager.model._meta.verbose_name} {next(iter(criteria.values()))!r} here")
    return found


def _messages(error: Exception) -> str:
    if isinstance(error, ValidationError) and hasattr(error, "message_dict"):
        return "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in error.message_dict.items())
    return str(error.args[0] if error.args else error)
