"""Policies, overrides, action costs and plans as plain JSON data, to review them and move them between
environments (`ratelimit_export`, `ratelimit_import`).

Rows are named by natural keys (a policy or a plan by its name, a cost by its action, a user by username,
a group by name), so a file exported on one site imports on another. Importing updates policies by name
and replaces the overrides of every policy in the file, creates or updates costs by action and plans by
name (replacing their limits and assignments); what the file does not name stays. `shape` says what is
wrong with a file, `importing` writes it all or nothing, `exporting` writes the file's data.
"""

from __future__ import annotations

from .exporting import export_data
from .importing import Imported, import_data
from .shape import ImportRefused, parse_json

__all__ = ["ImportRefused", "Imported", "export_data", "import_data", "parse_json"]
