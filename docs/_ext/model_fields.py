"""`model-fields` directive: a table of a Django model's fields (name, type, meaning) read from the model
itself, so the reference cannot drift from models.py."""

from __future__ import annotations

from enum import Enum

from django.apps import apps
from django.db import models
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") or "-"


def _kind(field: models.Field) -> str:
    if field.is_relation:
        return f"{type(field).__name__} to {field.related_model.__name__}"
    kind = field.deconstruct()[1].rsplit(".", 1)[1]  # the class migrations know: Django's for a registry's field
    if field.choices:
        kind += ": " + ", ".join(f"``{value}``" for value, _label in field.flatchoices)
    return kind


def _default(field: models.Field) -> str:
    if field.has_default() and not callable(field.default):
        value = field.default.value if isinstance(field.default, Enum) else field.default
        return f"``{value!r}``"
    if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
        return "set automatically"
    return "blank allowed" if field.blank else "required"


class ModelFields(SphinxDirective):
    required_arguments = 1  # app_label.ModelName

    def run(self) -> list[nodes.Node]:
        model = apps.get_model(self.arguments[0])
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 15 25 15 45", "",
                 "   * - field", "     - type", "     - default", "     - meaning"]
        for field in model._meta.get_fields():
            if field.auto_created or not field.concrete:
                continue
            meaning = _cell(field.help_text) if field.help_text else _cell(field.verbose_name)
            lines += [f"   * - ``{field.name}``", f"     - {_cell(_kind(field))}", f"     - {_default(field)}",
                      f"     - {meaning}"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.arguments[0]), self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("model-fields", ModelFields)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
