"""Policies declared in code, kept as ordinary Policy rows marked source='code': `declarations` (validated,
no database), `known` (this process's, merged into the policy index at once), `rows` (written before the index
loads and after migrate; an operator's change wins until reverted).
"""

from __future__ import annotations

from .declarations import CodePolicy, code_policy, fixed_cost_problem, slug_name
from .known import (
    add_provider,
    code_costs,
    declarations,
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
    restore_declarations,
    undeclare,
    view_path,
)
from .rows import (
    changed_fields, no_longer_in_code, revert, sync, sync_pending, unsaved_row, unwritten_said, write_pending,
)

__all__ = [
    "CodePolicy",
    "add_provider",
    "changed_fields",
    "code_costs",
    "code_policy",
    "declarations",
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
    "restore_declarations",
    "revert",
    "slug_name",
    "sync",
    "sync_pending",
    "unwritten_said",
    "undeclare",
    "unsaved_row",
    "view_path",
    "write_pending",
]
