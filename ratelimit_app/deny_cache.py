"""The local deny cache: a subject over an enforcing limit is refused from memory until its retry time.

A flood from one subject then costs no Redis call per refused request. It only ever refuses (never
admits), and only while the engine itself would refuse: until the retry time the engine gave, for the
same subject, limit and cost under the same terms of the same enforcing policy (its generation, mode,
strategy, window and bucket). A request of another cost asks Redis: its wait is not the one remembered.
A reset, a policy change announced in Redis, a FLUSHDB through the app's client (a test's
cache.clear()), a step of Redis's clock (engine/server_clock.py: a refusal the worker timed by its old
reading of that clock may end later than Redis's) or a change of the cache settings clears it, and a
refusal Redis gave before such a clear is not remembered after it.
The refusals still reach the policies' totals through the tally (engine/tally.py), as the engine's own do.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Sequence

from .conf import get_setting
from . import engine
from .engine import NOW, shard_of, when_flushed
from .lru import BoundedCache, size_of
from .values import charge, splits

if TYPE_CHECKING:
    from .values import Check, CompiledPolicy, Decision


def _refusal_size(key: tuple, entry: tuple) -> int:
    # the policy and the subject are shared with the request path: the key's tuples, the decision, its figures
    return size_of(key, key[0], entry, entry[0], entry[1], entry[1].reset_in, entry[1].retry_after)


class DenyCache:
    def __init__(self) -> None:
        # subjects over a limit, within the deny cache's share of RATELIMIT_CACHE_BYTES: the oldest
        # are forgotten first (a lookup takes no lock: a single dict read is atomic)
        self._until = BoundedCache("ratelimit_app.deny_cache.refusals", _refusal_size)
        self._lock = threading.Lock()  # the epoch and what remember() keeps move together
        # moves on with every clear(): a refusal asked for before a clear (a reset, a reload) may
        # describe what the clear discarded, so remember() keeps only those asked for since
        self.epoch = 0

    @staticmethod
    def _key(policy: CompiledPolicy, subject_key: str, limit: int, cost: int) -> tuple:
        # whatever decides a refusal: a policy compiled anew with other terms meets none of its old entries
        terms = (policy.id, policy.generation, policy.shape, policy.mode, policy.window_ms, policy.bucket_ms)
        return terms, subject_key, limit, cost

    def denied(self, checks: Sequence[Check], cost: int = 1) -> list[Decision]:
        """The cached denials among these checks for a request of `cost` units (each policy's own
        charge: values.charge), their times brought up to date; [] when none applies. Only a refusal of
        the same cost answers: fewer units may fit, and more wait longer than the time remembered (a
        client retrying then must fit)."""
        if not self._until.entries:  # the dict itself: no call on every request
            return []
        now = time.monotonic()
        found = []
        split = cost != 1 and splits(checks, cost)
        for check in checks:
            if not check.policy.enforce:
                continue  # a shadow policy never refuses, from memory or not
            key = self._key(check.policy, check.subject.key, check.limit, charge(check.policy, cost, split))
            entry = self._until.get(key)
            if entry is None:
                continue
            until, decision = entry
            left = until - now
            if left <= 0:
                self._until.pop(key)
                continue
            elapsed = decision.retry_after - left
            found.append(decision._replace(retry_after=left, reset_in=max(decision.reset_in - elapsed, left)))
        if found:
            self._count(found)
        return found

    def remember(self, decisions: Sequence[Decision], epoch: int) -> None:
        """Keep every enforcing decision over its limit until its retry time, for its cost, unless the
        cache was cleared since `epoch` (read before Redis was asked)."""
        now = time.monotonic()
        for decision in decisions:
            # an in-flight place may come back any moment (its retry is a guess), and so may a metered unit (a
            # request that used less than its estimate settles it back, in any worker): never remembered
            policy = decision.policy
            if not decision.allowed and decision.retry_after and not (policy.holds or policy.meters):
                with self._lock:
                    if epoch != self.epoch:
                        return
                    key = self._key(decision.policy, decision.subject.key, decision.limit, decision.cost)
                    self._until.put(key, (now + decision.retry_after, decision))

    @staticmethod
    def _count(refusals: Sequence[Decision]) -> None:
        engine.tally.add((decision.policy, shard_of(decision.subject.key), "d", NOW) for decision in refusals)

    def clear(self) -> None:
        with self._lock:
            self._until.clear()
            self.epoch += 1


deny_cache = DenyCache()
# a FLUSHDB or FLUSHALL sent through the app's client (django-redis' cache.clear() in a test) empties
# Redis: refusals from before it no longer hold
when_flushed(deny_cache.clear)
# a fixed window's refusal ends when the worker's reading of Redis's clock says the window ends: once that
# reading moves by a step, the ends remembered may lie past Redis's own (then it admits, and memory would not)
engine.server_clock.when_stepped(deny_cache.clear)


def enabled() -> bool:
    return get_setting("RATELIMIT_DENY_CACHE")
