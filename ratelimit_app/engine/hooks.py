"""What the engine reports to the layers above it without importing them: events.py and metrics.py
set these as they load; until then each does nothing."""

from __future__ import annotations

from typing import Callable


def _ignore(*args: object) -> None:
    pass


class Hooks:
    """The callables the engine calls; replace an attribute to be told."""

    def __init__(self) -> None:
        self.circuit_opened: Callable[[BaseException], None] = _ignore  # Redis failed to answer: the circuit opened
        self.circuit_closed: Callable[[], None] = _ignore  # the first answer after an outage closed it
        self.decided: Callable[[float], None] = _ignore  # seconds a decision's Redis call took, round trip included
        self.flushed: Callable[[], None] = _ignore  # the tally's flush ended (on its thread, or a reader's, or at exit)
        # what this worker says of its policies in its heartbeat ('loaded_at|error'; '' says nothing)
        self.worker_state: Callable[[], str] = str


hooks = Hooks()
