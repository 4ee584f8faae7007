"""Sphinx configuration: Markdown pages (myst-parser), the furo theme, the Python API through autodoc.

Built by `make docs` (and by the test suite) with -W: a broken reference or a docstring Sphinx cannot
read fails the build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext"), str(HERE)]
os.environ["DJANGO_SETTINGS_MODULE"] = "django_settings"  # autodoc imports models: Django must be set up

import django  # noqa: E402

django.setup()

import ratelimit_app  # noqa: E402

project = "ratelimit_app"
author = "ratelimit_app contributors"
copyright = "2026, ratelimit_app contributors"
version = release = ratelimit_app.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "model_fields", "no_empty_entries", "strategy_list"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]

html_theme = "furo"
html_title = f"ratelimit_app {release}"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
