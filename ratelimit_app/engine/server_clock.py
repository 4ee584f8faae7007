"""Redis's clock as this worker tells it. A reply that read no clock (a fixed window's repeat) leaves
the worker to work out when the window ends: by Redis's time as last measured, carried forward on the
worker's monotonic clock, so that neither a drifted host clock nor a step of it moves a window's end.
A step of Redis's own clock shows in the next reply that carries its time, or the next heartbeat."""

from __future__ import annotations

from time import monotonic, time
from typing import Any, Callable

# a reading of TIME whose round trip took longer than this (and than twice the best one so far) is
# not taken: a pause (a collector, a starved thread) between Redis's answer and its reading would move it
STEADY_TRIP_MS = 10.0
# a move of the reading this large is a step of Redis's clock: what was worked out by the old reading (a
# refusal the deny cache remembers) no longer holds; smaller moves are the readings' own error and drift
STEP_MS = 1000.0


class ServerClock:
    """Redis's time less this worker's monotonic time, measured by a TIME read beside each of the tally's
    heartbeats (off a request's way); until the first, from a reply that carried Redis's time."""

    __slots__ = ("offset_ms", "best_trip_ms", "_on_step")

    def __init__(self) -> None:
        self.offset_ms: float | None = None  # None: never measured, the worker's own clock stands in
        self.best_trip_ms: float | None = None  # the shortest round trip of a reading taken; None: none yet
        self._on_step: list[Callable[[], None]] = []

    def when_stepped(self, forget: Callable[[], None]) -> None:
        """Call `forget` whenever the reading moves by STEP_MS or more (Redis's clock stepped)."""
        self._on_step.append(forget)

    def now_ms(self) -> int:
        """Redis's time now, in milliseconds, as far as this worker can tell without asking."""
        if self.offset_ms is None:
            return int(time() * 1000)
        return int(monotonic() * 1000 + self.offset_ms)

    def seen(self, server_ms: int, asked: float | None = None) -> None:
        """A reply just read says Redis's time was `server_ms` during a call sent at `asked` (monotonic s).
        Taken as it is until a timed reading exists; then it moves the reading only as far as the reading
        contradicts it: Redis ran the call after it was sent and before its reply was read, however late
        (a step of Redis's clock). A reply read late alone never moves it."""
        earliest = server_ms - monotonic() * 1000  # the offset is at least this (read after Redis ran it)
        offset = self.offset_ms
        if self.best_trip_ms is None or offset is None:  # (None too while another thread forgets)
            self._moved(earliest)
        elif offset < earliest - STEADY_TRIP_MS:
            self._moved(earliest)
        elif asked is not None and offset > server_ms + 1 - asked * 1000 + STEADY_TRIP_MS:
            self._moved(server_ms + 1 - asked * 1000)  # at most this: Redis ran it after it was sent (ms truncated)

    def read(self, redis_client: Any) -> None:
        """Ask Redis for its TIME, and take it as the moment halfway through the round trip, unless the
        trip was much slower than the best one so far."""
        asked = monotonic()
        seconds, micros = _time_of(redis_client)
        answered = monotonic()
        trip_ms = (answered - asked) * 1000
        if self.best_trip_ms is not None and trip_ms > max(STEADY_TRIP_MS, 2 * self.best_trip_ms):
            return
        self.best_trip_ms = trip_ms if self.best_trip_ms is None else min(trip_ms, self.best_trip_ms)
        self._moved(int(seconds) * 1000 + int(micros) / 1000 - (asked + answered) * 500)

    def _moved(self, offset_ms: float) -> None:
        before, self.offset_ms = self.offset_ms, offset_ms
        if before is not None and abs(offset_ms - before) >= STEP_MS:
            for forget in self._on_step:
                forget()

    def forget(self) -> None:
        self.offset_ms = self.best_trip_ms = None


def server_ms(redis_client: Any) -> int:
    """Redis's TIME in milliseconds, asked now (off a request's way: the admin's operations)."""
    seconds, micros = _time_of(redis_client)
    return int(seconds) * 1000 + int(micros) // 1000


def _time_of(redis_client: Any) -> tuple:
    reply = redis_client.time()
    if isinstance(reply, dict):  # a cluster client that asked every node: their clocks are one here
        reply = next(iter(reply.values()))
    return reply


server_clock = ServerClock()
