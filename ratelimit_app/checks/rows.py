"""The policies' rows as a check may read them: never before their table exists, never breaking a
transaction around the check (shared by the checks that compare code or routes with the rows)."""

from __future__ import annotations

from django.db import DatabaseError, connections, transaction

from ..models import Policy

POLICY_COLUMNS = (
    "name", "action", "limit", "window", "strategy", "burst", "bucket_size", "enabled", "mode", "source",
)


def readable_policies(database: str) -> list | None:
    """The policies of `database`, or None when they cannot be read: migrate runs the checks before it
    creates (or changes) the table, and a check must never stop it."""
    table = Policy._meta.db_table
    try:
        if table not in connections[database].introspection.table_names():
            return None
        with transaction.atomic(using=database):  # a failed query must not break a transaction around the check
            return list(Policy.objects.using(database).only(*POLICY_COLUMNS))
    except DatabaseError:
        return None
