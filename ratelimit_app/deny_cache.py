"""The local deny cache: a subject over an enforcing limit is refused from memory until its retry time.

A flood from one subject then costs no Redis call per refused request. It only ever refuses (never
admits), and only while the engine itself would refuse: until the retry time the engine gave, for the
same policy generation, subject and limit. A policy change or a reset clears it (the index reloads).
The refusals still reach the policies' totals: a background thread adds them at most a second later
(and a reader in this process adds them first, so what it shows is complete).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Sequence

import redis

from . import keys
from .conf import get_setting
from .connection import client
from .scripts import run_each, scripts, totals_bucket_ms

if TYPE_CHECKING:
    from .engine import Check, Decision
    from .policies import CompiledPolicy

logger = logging.getLogger("ratelimit_app")
MAX_ENTRIES = 10_000  # subjects over a limit at once in one process; beyond that, the oldest are forgotten
FLUSH_SECONDS = 1.0


class DenyCache:
    def __init__(self) -> None:
        self._until: dict[tuple, tuple[float, Decision]] = {}
        # refusals not yet in Redis's totals, by policy and the refused subject's shard
        self._pending: Counter[tuple[CompiledPolicy, int]] = Counter()
        self._lock = threading.Lock()
        self._flusher: threading.Timer | None = None

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
                if len(self._until) >= MAX_ENTRIES:
                    self._until.pop(next(iter(self._until)), None)
                self._until[self._key(check)] = (now + decision.retry_after, decision)

    def _count(self, refusals: Sequence[Decision]) -> None:
        with self._lock:
            for decision in refusals:
                self._pending[decision.policy, keys.shard_of(decision.subject.key)] += 1
            if self._flusher is None:
                self._flusher = threading.Timer(FLUSH_SECONDS, self.flush)
                self._flusher.daemon = True
                self._flusher.start()

    def flush(self) -> None:
        """Add the refusals counted here to the policies' totals in Redis (kept for later if it fails)."""
        with self._lock:
            pending, self._pending, self._flusher = self._pending, Counter(), None
        if not pending:
            return
        by_shard: dict[int, tuple[list[str], list[str | int]]] = {}  # one call per shard: one cluster slot each
        for (policy, shard), count in pending.items():
            totals, args = by_shard.setdefault(shard, ([], [""]))
            totals.append(keys.totals_key(policy, shard))
            args += (count, policy.window_ms, totals_bucket_ms(policy))
        try:
            redis_client = client()  # a cluster client connects as it is created: inside the try
            run_each(redis_client, scripts.get("denials", redis_client), list(by_shard.values()))
        except redis.RedisError as error:
            logger.warning("ratelimit: refusals from the deny cache could not reach Redis yet: %s", error)
            with self._lock:
                self._pending.update(pending)

    def clear(self) -> None:
        self._until.clear()


deny_cache = DenyCache()


def enabled() -> bool:
    return get_setting("RATELIMIT_DENY_CACHE")
