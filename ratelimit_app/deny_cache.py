"""The local deny cache: a subject over an enforcing limit is refused from memory until its retry time.

A flood from one subject then costs no Redis call per refused request. It only ever refuses (never
admits), and only while the engine itself would refuse: until the retry time the engine gave, for the
same policy generation, subject and limit. A policy change or a reset clears it (the index reloads).
The refusals still reach the policies' totals through the tally (tally.py), as the engine's own do.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Sequence

from . import keys
from .conf import get_setting
from .tally import NOW, tally

if TYPE_CHECKING:
    from .engine import Check, Decision

MAX_ENTRIES = 10_000  # subjects over a limit at once in one process; beyond that, the oldest are forgotten


class DenyCache:
    def __init__(self) -> None:
        self._until: dict[tuple, tuple[float, Decision]] = {}
        # every change of _until: evicting iterates it, which a change from another thread breaks
        # (lookups need none: a single dict read is atomic)
        self._lock = threading.Lock()

    @staticmethod
    def _key(check: Check) -> tuple:
        return check.policy.id, check.policy.generation, check.subject.key, check.limit

    def denied(self, checks: Sequence[Check]) -> list[Decision]:
        """The cached denials among these checks, their times brought up to date; [] when none applies."""
        if not self._until:
            return []
        now = time.monotonic()
        found = []
        for check in checks:
            entry = self._until.get(self._key(check))
            if entry is None:
                continue
            until, decision = entry
            left = until - now
            if left <= 0:
                with self._lock:
                    self._until.pop(self._key(check), None)
                continue
            elapsed = decision.retry_after - left
            found.append(decision._replace(retry_after=left, reset_in=max(decision.reset_in - elapsed, left)))
        if found:
            self._count(found)
        return found

    def remember(self, checks: Sequence[Check], decisions: Sequence[Decision]) -> None:
        """Keep every enforcing decision over its limit until its retry time."""
        now = time.monotonic()
        for check, decision in zip(checks, decisions):
            if not decision.allowed and decision.retry_after:
                with self._lock:
                    if len(self._until) >= MAX_ENTRIES:
                        del self._until[next(iter(self._until))]
                    self._until[self._key(check)] = (now + decision.retry_after, decision)

    @staticmethod
    def _count(refusals: Sequence[Decision]) -> None:
        tally.add((decision.policy, keys.shard_of(decision.subject.key), "d", NOW) for decision in refusals)

    def clear(self) -> None:
        with self._lock:
            self._until.clear()


deny_cache = DenyCache()


def enabled() -> bool:
    return get_setting("RATELIMIT_DENY_CACHE")
