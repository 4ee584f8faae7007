"""`strategy-list` directive: the registered strategies (name, what each does, the fields only it reads)
read from the registry, so the reference lists every strategy the code has."""

from __future__ import annotations

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

from ratelimit_app import strategies


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") or "-"


class StrategyList(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 15 45 40", "",
                 "   * - strategy", "     - how it counts", "     - fields only it reads"]
        for name, strategy in strategies.STRATEGIES.items():
            default = " (the default)" if name == strategies.DEFAULT else ""
            notes = "".join(f" ``{field}``: {note}." for field, note in strategy.notes.items())
            options = " ".join(f"``{option}``: {text}" for option, text in strategy.options.items())
            lines += [f"   * - ``{name}``", f"     - {strategy.label}{default}: {_cell(strategy.help + notes)}",
                      f"     - {_cell(options)}"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="strategy-list"), self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("strategy-list", StrategyList)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
