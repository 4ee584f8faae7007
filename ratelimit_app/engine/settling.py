"""Metered usage settled after the request: the counters of its metered policies move by what it used
beyond (or short of) its estimate, with lua/settle.lua, one EVAL per slot, sent beside the give-back of
places (giveback.py) in the same write."""

from __future__ import annotations

from importlib import resources
from typing import Callable, Sequence

from ..values import Adjustment
from . import keys
from .hooks import hooks

# The script's code without its comments: EVAL hashes what it is sent, at every settle.
_SOURCE = resources.files("ratelimit_app").joinpath("lua", "settle.lua").read_text(encoding="utf-8")
SETTLE = "\n".join(line for line in _SOURCE.splitlines() if line.strip() and not line.lstrip().startswith("--"))


def settle_commands(
    adjustments: Sequence[Adjustment], slot_of: Callable[[str], int] | None, now_ms: int | None = None
) -> list[tuple[str, tuple, list[Adjustment]]]:
    """(a key, the EVAL, its adjustments) for each slot their counters live in (`slot_of` None: one
    server, one EVAL). `now_ms` replaces Redis's clock (tests)."""
    hooks.settled(adjustments)
    key_prefix = keys.prefix()
    groups: dict[int, tuple[list[str], list, list[Adjustment]]] = {}
    for adjustment in adjustments:
        charged = adjustment.charged
        counter = keys.counter_key(charged.policy, charged.subject.key, key_prefix)
        counters, args, group = groups.setdefault(slot_of(counter) if slot_of else 0, ([], [], []))
        counters.append(counter)
        args += (charged.layout, adjustment.units, charged.anchor, charged.figure)
        group.append(adjustment)
    moment = "" if now_ms is None else now_ms
    return [(counters[0], ("EVAL", SETTLE, len(counters), *counters, moment, *args), group)
            for counters, args, group in groups.values()]
