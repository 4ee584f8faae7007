"""The counting strategies. Each is one unit: strategies/<name>.py (what a policy of it may hold, its
key shape, what its count is compared with, how the live page reads it) beside lua/<name>.lua (the
contract in lua/contract.lua). The policy's choices (read at each use, in no migration), the admin
form, the tester and the docs' list come from here: CONTRIBUTING.md says how to add one.

The registry refuses, as it loads, a strategy that would fail later and elsewhere: one sharing its
letter with another (their counters would share keys), one with no reference model, one whose Lua half
does not define the contract's functions."""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Iterable

from django.core.exceptions import ImproperlyConfigured

from .base import Strategy

CONTRACT = ("look", "charge", "refund")  # what lua/contract.lua asks of a strategy's Lua half
EARLIER = ("peek", "take", "undo")  # the contract before it, which nothing adapts any more


def _lua_functions(strategy: Strategy) -> set[str]:
    """The names the Lua half defines on strategies.<name>: the fields of its table (`look = function`,
    `look = look,`) and the functions assigned to it (`function strategies.<name>.look(`)."""
    source, name = strategy.script(), re.escape(strategy.name)
    found = set(re.findall(rf"^\s*function\s+strategies\.{name}\.(\w+)\s*\(", source, re.MULTILINE))
    found |= set(re.findall(rf"^\s*strategies\.{name}\.(\w+)\s*=", source, re.MULTILINE))
    table = re.search(rf"^\s*strategies\.{name}\s*=\s*\{{", source, re.MULTILINE)
    if table:
        fields = re.compile(r"^\s*(\w+)\s*=\s*(?:function\b|[\w.]+\s*,)", re.MULTILINE)
        found |= set(fields.findall(source, table.end()))
    return found


def _refusals(found: Iterable[Strategy]) -> list[str]:
    refusals, letters = [], {}
    for strategy in found:
        name = strategy.name
        other = letters.setdefault(strategy.letter, name)
        if other != name:
            refusals.append(
                f"the strategies {other!r} and {name!r} share the letter {strategy.letter!r}: their counters would "
                "share keys, and a policy moved from one to the other would read the other's (or fail with WRONGTYPE)"
            )
        if not strategy.reference:
            refusals.append(
                f"the strategy {name!r} declares no reference model: set its `reference` to the test that decides "
                "it against one (tests/<file>.py::<name>)"
            )
        if not strategy.counts_units and not strategy.unit_refusal:
            refusals.append(
                f"the strategy {name!r} counts no metered unit but does not say why: set its `unit_refusal`, "
                "which the admin, the checks and the import show where a policy of it declares a unit"
            )
        if strategy.counts_units and type(strategy).settling is Strategy.settling:
            refusals.append(
                f"the strategy {name!r} counts metered units but says not how a settle moves its counter: define "
                "its `settling` (lua/settle.lua's layouts), or set counts_units = False with its unit_refusal"
            )
        defined = _lua_functions(strategy)
        missing = [function for function in CONTRACT if function not in defined]
        if missing:
            earlier = " (it speaks the earlier contract: peek, take, undo)" if set(EARLIER) <= defined else ""
            refusals.append(
                f"the strategy {name!r}: lua/{strategy.lua} does not define {', '.join(missing)} on "
                f"strategies.{name}{earlier}; lua/contract.lua says what each does"
            )
    return refusals


def registry(found: Iterable[Strategy]) -> dict[str, Strategy]:
    """The strategies by name, in their order; ImproperlyConfigured naming each one that cannot count."""
    found = sorted(found, key=lambda strategy: strategy.order)
    refusals = _refusals(found)
    if refusals:
        raise ImproperlyConfigured("Strategies refused: " + "; ".join(refusals) + ".")
    return {strategy.name: strategy for strategy in found}


def _discover() -> list[Strategy]:
    return [
        importlib.import_module(f"{__name__}.{module.name}").STRATEGY
        for module in pkgutil.iter_modules(__path__)
        if module.name != "base"
    ]


STRATEGIES: dict[str, Strategy] = registry(_discover())
DEFAULT = next(name for name, strategy in STRATEGIES.items() if strategy.default)


def get(name: str) -> Strategy:
    """The strategy called `name` (KeyError for none)."""
    return STRATEGIES[name]


def choices() -> list[tuple[str, str]]:
    return [(name, strategy.label) for name, strategy in STRATEGIES.items()]


def help_text() -> str:
    return " ".join(f"{name}: {strategy.help}" for name, strategy in STRATEGIES.items())


def using(option: str) -> list[str]:
    """The strategies that read a policy field (`bucket_size`, `burst`)."""
    return [name for name, strategy in STRATEGIES.items() if option in strategy.options]


def counting_units() -> list[str]:
    """The strategies whose count may move by any number of units after a request (a metered unit)."""
    return [name for name, strategy in STRATEGIES.items() if strategy.counts_units]


def calendar() -> str:
    """The strategy that counts calendar periods (a rate such as '10000/month' is counted by it)."""
    return using("period")[0]


def counting_like(library: str) -> str:
    """The strategy that counts as `library` does ('drf', 'django-ratelimit'), for its compat layer."""
    return next(name for name, strategy in STRATEGIES.items() if library in strategy.counts_like)


def field_help(field: str, text: str) -> str:
    """A shared field's help, with what it means for the strategies that read it their own way."""
    notes = [
        f"For {name}: {strategy.notes[field]}." for name, strategy in STRATEGIES.items() if field in strategy.notes
    ]
    return " ".join([text, *notes])


def option_help(option: str) -> str:
    """The admin's help for a field that only some strategies read."""
    names = using(option)
    return f"{' or '.join(names)} only: {STRATEGIES[names[0]].options[option]}"
