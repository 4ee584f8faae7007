"""Policies, overrides, action costs and plans as JSON data by natural keys, to review them and move them
between sites: `shape` (what is wrong with a file), `importing` (all or nothing), `exporting`.
"""

from __future__ import annotations

from .exporting import export_data
from .importing import Imported, import_data
from .shape import ImportRefused, parse_json

__all__ = ["ImportRefused", "Imported", "export_data", "import_data", "parse_json"]
