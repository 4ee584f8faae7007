"""Log lines about failures that repeat (a database away, retried every second; a receiver of the site's
that fails at every refusal): said once per kind per LOG_EVERY seconds, as the boundary's faults."""

from __future__ import annotations

import threading
import time

LOG_EVERY = 60.0  # seconds between two log lines of one kind of fault


class LogGate:
    """Whether a log line of a kind is due: at most once per LOG_EVERY seconds. Kinds are few (classes of
    errors, signal names): the gate keeps one number per kind."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._lock = threading.Lock()

    def due(self, kind: str = "") -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._at.get(kind, -LOG_EVERY) < LOG_EVERY:
                return False
            self._at[kind] = now
            return True

    def reset(self) -> None:
        with self._lock:
            self._at.clear()
