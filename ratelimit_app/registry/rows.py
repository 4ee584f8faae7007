"""The rows of policies declared in code: written before the policy index loads and after migrate (an
insert never fails on a row another worker wrote first); an operator's change wins until reverted."""

from __future__ import annotations

import logging
from hashlib import blake2b
from typing import Any, Sequence

from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.db.models.signals import post_migrate
from django.dispatch import receiver
from django.utils import timezone

from ..loggate import LogGate
from ..models import Policy, Source
from . import known
from .declarations import CODE_FIELDS, COMPUTED, OPERATOR_FIELDS, RATE_FIELDS, CodePolicy, error_text

logger = logging.getLogger("ratelimit_app")
unwritten_said = LogGate()


def sync(policies: Sequence[CodePolicy] | None = None, *, using: str = "default") -> int:
    """Create or update the rows of declared policies (all of them by default); returns how many rows
    were written.

    A row another worker wrote first is taken as it is (the insert skips it, nothing fails, nothing is
    logged) and updated only if this process's code declares other values. A database error is logged,
    not raised: the index enforces the declarations without their rows meanwhile.
    """
    policies = known.declared_policies() if policies is None else list(policies)
    try:
        written = _write(policies, using)
    except DatabaseError as error:
        if unwritten_said.due():  # tried again every second while the database is away: said once a minute
            logger.error("ratelimit: could not write the policies declared in code to the database (tried again "
                         "every second, enforced as declared meanwhile): %s", error)
        known.retry_later()
        return 0
    known.mark_written(policies)
    if written:
        known.changed(using)  # this process reloads now, the others once committed
    return written


def write_pending(using: str = "default") -> int:
    """Write the rows of declarations not written yet; a flag test when there are none. Called before
    the policy index loads, so that it reads them."""
    written = known.take_pending()
    if written is None:
        return 0
    todo = [policy for policy in known.declared_policies() if policy.name not in written]
    return sync(todo, using=using) if todo else 0


def sync_pending(**kwargs: object) -> None:
    """At a request's start (a flag test after the first): at a process's first request, import the root
    URLconf so that its views declare their policies before the policy index first loads, and write the
    rows before the view runs (outside its transaction under ATOMIC_REQUESTS)."""
    known.declare_routes()
    write_pending()


@receiver(post_migrate, dispatch_uid="ratelimit_registry_sync")
def _after_migrate(sender, using: str = "default", **kwargs: object) -> None:
    if getattr(sender, "label", None) == "ratelimit_app":
        sync(using=using)


def unsaved_row(policy: CodePolicy) -> Policy:
    """The row a declaration stands for while it has none in the database. Its id is negative (never a
    row's) and the same in every process, so workers in that state still share their counters."""
    digest = blake2b(policy.name.encode(), digest_size=6).digest()
    pk = -1 - int.from_bytes(digest, "big")
    return Policy(pk=pk, name=policy.name, source=Source.CODE, code_values=policy.values, **policy.values)


def _write(policies: list[CodePolicy], using: str) -> int:
    """Insert the missing rows, then update those whose code changed. Reads run outside any
    transaction: on SQLite a transaction that read first cannot wait for another writer's lock."""
    manager = Policy.objects.using(using)
    names = [policy.name for policy in policies]
    rows = {row.name: row for row in manager.filter(name__in=names)}
    missing = [policy for policy in policies if policy.name not in rows]
    if missing:
        with transaction.atomic(using=using):
            manager.bulk_create([_new_row(policy) for policy in missing], ignore_conflicts=True)
        rows.update((row.name, row) for row in manager.filter(name__in=[policy.name for policy in missing]))
    updated = sum(_update_row(policy, rows[policy.name], using) for policy in policies if policy.name in rows)
    return len(missing) + updated


def _new_row(policy: CodePolicy) -> Policy:
    # a computed limit is marked: this process may declare it only at the first request it limits
    code_values = {**policy.values, COMPUTED: True} if policy.create_only else policy.values
    return Policy(
        name=policy.name, source=Source.CODE, code_values=code_values, description=policy.description, **policy.values
    )


def _update_row(policy: CodePolicy, row: Policy, using: str) -> bool:
    if policy.create_only and row.source == Source.CODE:
        return False
    if row.source != Source.CODE:
        logger.warning(
            "ratelimit: %s declares the policy %r, but a policy of that name was written in the admin; "
            "the admin's policy is kept. Rename one of them.", policy.origin, policy.name,
        )
        return False
    merged = _merge(row, policy.values)
    if merged == {field: getattr(row, field) for field in CODE_FIELDS} and row.code_values == policy.values:
        return False
    for field, value in merged.items():
        setattr(row, field, value)
    row.code_values = policy.values
    try:
        row.full_clean(exclude=["source"], validate_unique=False, validate_constraints=False)
    except ValidationError as error:
        logger.error(
            "ratelimit: the code's values for policy %r do not fit the admin's changes (%s); kept as it was.",
            policy.name, error_text(error),
        )
        return False
    with transaction.atomic(using=using):
        rows = Policy.objects.using(using).filter(pk=row.pk)
        rows.update(code_values=policy.values, updated=timezone.now(), **merged)
    return True


def _merge(row: Policy, declared: dict[str, Any]) -> dict[str, Any]:
    """The row's values after a deploy: the code's, except what the operator changed since the last one."""
    before = row.code_values or {}
    merged = {field: declared[field] for field in CODE_FIELDS}
    if any(getattr(row, field) != _coded(before, field) for field in RATE_FIELDS):
        merged.update({field: getattr(row, field) for field in RATE_FIELDS})
    for field in ("mode", "enabled"):
        if getattr(row, field) != before.get(field):
            merged[field] = getattr(row, field)
    return merged


# --- what the admin shows ----------------------------------------------------------------------


def changed_fields(row: Policy) -> list[str]:
    """The fields an operator changed away from the code's values (empty for an admin policy)."""
    if row.source != Source.CODE or not row.code_values:
        return []
    return [field for field in OPERATOR_FIELDS if getattr(row, field) != _coded(row.code_values, field)]


def _coded(code_values: dict[str, Any], field: str) -> Any:
    """What the code declared for `field`: a field added since the row was written (the unit) was its default."""
    if field in code_values:
        return code_values[field]
    return Policy._meta.get_field(field).get_default()


def no_longer_in_code(row: Policy, names: set[str] | None = None) -> bool:
    """A code policy that nothing loaded in this process declares any more (kept and enforced as it is).

    Unknown (False) for a limit computed per request, declared only when a request first meets it.
    """
    if row.source != Source.CODE or (row.code_values or {}).get(COMPUTED):
        return False
    return row.name not in (known.declared_names() if names is None else names)


def revert(row: Policy) -> list[str]:
    """Put the code's values back (the row is saved); returns the fields that changed."""
    changed = changed_fields(row)
    for field in changed:
        setattr(row, field, _coded(row.code_values, field))
    if changed:
        row.save()
    return changed
