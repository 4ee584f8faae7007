"""What the engine reports to the layers above it, and asks of them, without importing them: events.py,
metrics.py, quotas.py and policies.py set these as they load; until then each does nothing (saved_usage: nothing
saved; worker_state: says nothing)."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ..values import Check, CompiledPolicy


def _ignore(*args: object) -> None:
    pass


def _nothing_saved(checks: Iterable[Check], now_ms: int) -> dict[tuple[int, str], tuple[int, int]]:
    return {(c.policy.id, c.subject.key): (c.policy.plugin.span(c.policy, now_ms)[0], 0) for c in checks}


class Hooks:
    """The callables the engine calls; replace an attribute to be told."""

    def __init__(self) -> None:
        self.circuit_opened: Callable[[BaseException], None] = _ignore  # Redis failed to answer: the circuit opened
        self.circuit_closed: Callable[[], None] = _ignore  # the first answer after an outage closed it
        self.decided: Callable[[float], None] = _ignore  # seconds a decision's Redis call took, round trip included
        self.flushed: Callable[[], None] = _ignore  # the tally's flush ended (on its thread, or a reader's, or at exit)
        # a count of a strategy that keeps its usage beyond Redis (an `asked` one): (policy, subject key,
        # subject display, its span's start ms, count, the subject's limit), after every decision that counted
        self.counted: Callable[[CompiledPolicy, str, str, int, int, int], None] = _ignore
        # settled usage about to be written (Adjustments): the counters it moves, whose saved usage follows
        self.settled: Callable[[Sequence], None] = _ignore
        # checks whose counter the Lua half found absent, at `now_ms` -> (policy id, subject key) -> (span
        # start ms, usage saved) for each: the call is made again with it (a database query, once a span)
        self.saved_usage: Callable[[Iterable[Check], int], dict[tuple[int, str], tuple[int, int]]] = _nothing_saved
        # what this worker says of its policies in its heartbeat ('loaded_at|error'; '' says nothing)
        self.worker_state: Callable[[], str] = str


hooks = Hooks()
