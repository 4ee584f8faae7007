"""The counting strategies. Each is one unit: strategies/<name>.py (what a policy of it may hold, its
key shape, what its count is compared with, how the live page reads it) beside lua/<name>.lua (the
contract at the top of decide.lua). The policy's choices (read at each use, in no migration), the admin
form, the tester and the docs' list come from here: CONTRIBUTING.md says how to add one."""

from __future__ import annotations

import importlib
import pkgutil

from .base import Strategy


def _discover() -> dict[str, Strategy]:
    found = [
        importlib.import_module(f"{__name__}.{module.name}").STRATEGY
        for module in pkgutil.iter_modules(__path__)
        if module.name != "base"
    ]
    return {strategy.name: strategy for strategy in sorted(found, key=lambda strategy: strategy.order)}


STRATEGIES: dict[str, Strategy] = _discover()
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
