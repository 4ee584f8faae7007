"""Policies declared in code (@ratelimit(rate=...), RATELIMIT_POLICIES, the compat modules), kept as
ordinary Policy rows marked source='code' so that every door, the live page and the admin treat them alike.

Declaring touches no database (`declarations`): it marks the policy index stale, and the index is built
from the rows merged with what this process knows (`known`), so a worker enforces every declaration from
its first request, whatever the database holds. The rows are written before the index loads and after
migrate (`rows`); an operator's change in the admin wins over the code until it is reverted.
"""

from __future__ import annotations

from .declarations import CodePolicy, code_policy, fixed_cost_problem, slug_name
from .known import (
    add_provider,
    code_costs,
    declarations_of,
    declare_policy,
    declared,
    declared_names,
    declared_on,
    declared_policies,
    forget_declarations,
    forget_routes,
    forget_synced,
    not_written,
    note_cost,
    on_change,
    register_policy,
    undeclare,
    view_path,
)
from .rows import changed_fields, no_longer_in_code, revert, sync, sync_pending, unsaved_row, write_pending

__all__ = [
    "CodePolicy",
    "add_provider",
    "changed_fields",
    "code_costs",
    "code_policy",
    "declarations_of",
    "declare_policy",
    "declared",
    "declared_names",
    "declared_on",
    "declared_policies",
    "fixed_cost_problem",
    "forget_declarations",
    "forget_routes",
    "forget_synced",
    "no_longer_in_code",
    "not_written",
    "note_cost",
    "on_change",
    "register_policy",
    "revert",
    "slug_name",
    "sync",
    "sync_pending",
    "undeclare",
    "unsaved_row",
    "view_path",
    "write_pending",
]
