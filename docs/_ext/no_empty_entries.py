"""Fails the build (a warning, and the build runs with -W) on an API reference entry that would be empty:
a class, function or module that autodoc documents without a docstring of its own."""

from __future__ import annotations

from sphinx.util import logging

logger = logging.getLogger(__name__)

EMPTY_IS_WRONG = {"module", "class", "exception", "function", "method"}


def check_docstring(app, what, name, obj, options, lines) -> None:
    module = getattr(obj, "__module__", None)
    if what in ("class", "exception", "function") and module and not name.startswith(f"{module}."):
        return  # a name a module imports: autodoc weighs it, then leaves it out
    if what in EMPTY_IS_WRONG and not any(line.strip() for line in lines):
        logger.warning("%s %s has no docstring: its entry in the API reference would be empty", what, name,
                       type="autodoc", subtype="empty")


def setup(app):
    app.connect("autodoc-process-docstring", check_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
