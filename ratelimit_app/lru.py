"""Every cache a process keeps, bounded in bytes by one accounting.

A worker caches what spares its request path work (a subject's script arguments, its packed command, a
parsed address ...). Each cache takes a share of RATELIMIT_CACHE_BYTES, declared in BUDGETS: the one
place that says what a process may keep, whatever the number of policies, subjects or threads. A
cache's entries are counted in bytes (estimated from sys.getsizeof, or a known most per entry);
past its share the oldest go. A cache not declared in BUDGETS cannot be made.

functools.lru_cache alone bounds the number of entries: 8,192 entries keyed by 2 MB strings hold 16 GB.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import OrderedDict
from functools import lru_cache, wraps
from typing import Any, Callable, Hashable, Protocol, TypeVar

from .conf import get_setting

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("ratelimit_app")

# Each cache's share of RATELIMIT_CACHE_BYTES (32 MB by default), by where it lives. The largest go to
# what a decision sends: a subject's script arguments (about 500 bytes per policy) and its packed command.
BUDGETS: dict[str, float] = {
    "ratelimit_app.engine.arguments.script_parts": 0.40,
    "ratelimit_app.engine.decision_connection.packed": 0.20,
    "ratelimit_app.engine.aclients.packed": 0.06,
    "ratelimit_app.engine.arguments._terms": 0.005,
    "ratelimit_app.subjects.specs.single_subject": 0.06,
    "ratelimit_app.subjects.addresses._direct_ip": 0.03,
    "ratelimit_app.subjects.addresses.parse_address": 0.03,
    "ratelimit_app.subjects.addresses._grouped": 0.02,
    "ratelimit_app.doors._resolve_route": 0.035,
    "ratelimit_app.doors.route_policies": 0.02,
    "ratelimit_app.doors.unmatched_routes": 0.005,
    "ratelimit_app.doors.address_checks": 0.04,
    "ratelimit_app.deny_cache.refusals": 0.05,
    "ratelimit_app.headers._quoted": 0.003,
    "ratelimit_app.headers._quota": 0.003,
    "ratelimit_app.headers._policy_item": 0.003,
    "ratelimit_app.headers._plain": 0.002,
    "ratelimit_app.metrics._outcomes": 0.003,
    "ratelimit_app.metrics._child": 0.003,
    "ratelimit_app.periods._zone": 0.002,
    # the calendar periods a strategy keeps (its plug-in module's own: named by its package, not by a strategy)
    "ratelimit_app.strategies.periods": 0.002,
    "ratelimit_app.throttling._refuse_cost": 0.002,
    "ratelimit_app.compat.drf._naming": 0.002,
    "ratelimit_app.compat.drf._code_policy": 0.004,
    "ratelimit_app.compat.django_ratelimit._code_policy": 0.01,
}
assert sum(BUDGETS.values()) <= 1.0, "the shares of RATELIMIT_CACHE_BYTES add up to more than all of it"

# What an entry costs besides its key and value: a dict's slot and an OrderedDict's link (or
# functools.lru_cache's link and key tuple), with the allocator's rounding
SLOT = 160
# what an entry of a function cache costs besides its key's characters: the link, the key tuple, the
# dict slot, a small result (a Subject, an address, a few URL names)
ENTRY_OVERHEAD = 512


class Bounded(Protocol):
    name: str

    def held(self) -> int: ...

    def budget(self) -> int: ...

    def clear(self) -> None: ...

    def forget_budget(self) -> None: ...

    def forked(self) -> None: ...


_caches: dict[str, Bounded] = {}  # the registry: every cache of the process, by its name in BUDGETS


def _register(cache: Bounded) -> None:
    if cache.name not in BUDGETS:
        raise LookupError(f"the cache {cache.name} has no share in ratelimit_app.lru.BUDGETS: declare it there")
    if cache.name in _caches:
        raise LookupError(f"two caches are called {cache.name}")
    _caches[cache.name] = cache


def share(name: str) -> int:
    """The bytes cache `name` may hold: its share of RATELIMIT_CACHE_BYTES."""
    return int(BUDGETS[name] * total())


def total() -> int:
    """RATELIMIT_CACHE_BYTES (a value that is no whole number >= 0 gives way to the default: conf.TYPES)."""
    return get_setting("RATELIMIT_CACHE_BYTES")


def caches() -> dict[str, Bounded]:
    """Every cache of the process, by name."""
    return dict(_caches)


def held() -> dict[str, int]:
    """The bytes each cache holds now (estimated), by name."""
    return {name: cache.held() for name, cache in _caches.items()}


def clear() -> None:
    """Empty every cache (a test's reset: as if the process had just started)."""
    for cache in _caches.values():
        cache.clear()


def forget_settings() -> None:
    """RATELIMIT_CACHE_BYTES changed: each cache reads its share again (emptied)."""
    for cache in _caches.values():
        cache.forget_budget()


def size_of(*objects: object) -> int:
    """sys.getsizeof of each object, added up (what it references is not counted)."""
    return sum(map(sys.getsizeof, objects))


class BoundedCache:
    """A dict kept within its share of bytes: `size(key, value)` estimates an entry (its slot excluded);
    past the share the oldest entries go first. A value larger than the whole share is not kept.

    `get` is the dict's own (a C call, without a lock: the request path's); put and the evictions take a lock."""

    def __init__(self, name: str, size: Callable[[Any, Any], int]) -> None:
        self.name = name
        self._size = size
        self._entries: OrderedDict = OrderedDict()
        self.entries = self._entries  # to read (its truth, a lookup), never to change: put() counts the bytes
        self.get = self._entries.get
        self._bytes = 0
        self._budget: int | None = None  # read at the first put: the settings may not be ready at import
        self._lock = threading.Lock()
        _register(self)

    def __len__(self) -> int:
        return len(self._entries)

    def forked(self) -> None:
        # a lock held by another thread at the fork would be held for ever in the child
        self._lock = threading.Lock()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def put(self, key: Hashable, value: Any) -> Any:
        """Keep `value` under `key` (unless it is larger than the share); returns it."""
        size = SLOT + self._size(key, value)
        with self._lock:
            budget = self._budget
            if budget is None:
                budget = self._budget = share(self.name)
            entries = self._entries
            old = entries.pop(key, None)
            if old is not None:
                self._bytes -= SLOT + self._size(key, old)
            if size > budget:
                return value
            while self._bytes + size > budget:
                oldest, gone = entries.popitem(last=False)
                self._bytes -= SLOT + self._size(oldest, gone)
            entries[key] = value
            self._bytes += size
        return value

    def pop(self, key: Hashable) -> None:
        with self._lock:
            gone = self._entries.pop(key, None)
            if gone is not None:
                self._bytes -= SLOT + self._size(key, gone)

    def evict_oldest(self) -> None:
        with self._lock:
            if self._entries:
                oldest, gone = self._entries.popitem(last=False)
                self._bytes -= SLOT + self._size(oldest, gone)

    def held(self) -> int:
        return self._bytes

    def budget(self) -> int:
        return share(self.name)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def forget_budget(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._budget = None


def byte_bounded_cache(max_bytes: int | None = None, max_chars: int = 256, entry_bytes: int | None = None,
                       name: str | None = None) -> Callable[[F], F]:
    """functools.lru_cache kept within the function's share of RATELIMIT_CACHE_BYTES (BUDGETS, by the
    function's dotted name unless `name`), and within `max_bytes` when given.

    Keyed by what a client sent (a header, a parameter, a path: the first argument), a call whose first
    argument is longer than `max_chars` is computed and never kept, so every entry costs at most
    ENTRY_OVERHEAD + 4 * max_chars bytes. Keyed by values of a known size (policies, numbers), an entry
    costs `entry_bytes`. The cache holds as many entries as its bytes allow: a long value costs a
    computation, never memory, and evicts nothing.

    The decorated function keeps lru_cache's `cache_info()` and `cache_clear()`.
    """
    per_entry = entry_bytes or ENTRY_OVERHEAD + 4 * max_chars  # 4: the widest character

    def decorate(function: F) -> F:
        cache = _FunctionCache(name or f"{function.__module__}.{function.__qualname__}", function, per_entry,
                               max_bytes)
        if entry_bytes is None:
            @wraps(function)
            def bounded(value: Any, *args: Any) -> Any:
                if len(value) > max_chars:
                    return function(value, *args)
                return cache.cached(value, *args)
        else:
            @wraps(function)
            def bounded(*args: Any) -> Any:
                return cache.cached(*args)

        bounded.cache_info = cache.cache_info  # type: ignore[attr-defined]
        bounded.cache_clear = cache.clear  # type: ignore[attr-defined]
        return bounded  # type: ignore[return-value]

    return decorate


class _FunctionCache:
    """One byte_bounded_cache: an lru_cache made, at the first call, as large as the share allows."""

    def __init__(self, name: str, function: Callable, per_entry: int, max_bytes: int | None) -> None:
        self.name, self.function, self.per_entry, self.max_bytes = name, function, per_entry, max_bytes
        self._lock = threading.Lock()
        self.cached: Callable = self._first
        _register(self)

    def _first(self, *args: Any) -> Any:
        self._first_size()
        return self.cached(*args)

    def budget(self) -> int:
        return share(self.name) if self.max_bytes is None else min(self.max_bytes, share(self.name))

    def cache_info(self) -> Any:
        info = getattr(self.cached, "cache_info", None)
        if info is None:  # not called yet: an empty cache of the size it will have
            self._first_size()
            info = self.cached.cache_info
        return info()

    def _first_size(self) -> None:
        with self._lock:
            if self.cached == self._first:
                self.cached = lru_cache(maxsize=max(1, self.budget() // self.per_entry))(self.function)

    def held(self) -> int:
        info = getattr(self.cached, "cache_info", None)
        return info().currsize * self.per_entry if info else 0

    def clear(self) -> None:
        clear = getattr(self.cached, "cache_clear", None)
        if clear is not None:
            clear()

    def forget_budget(self) -> None:
        self.cached = self._first

    def forked(self) -> None:
        self._lock = threading.Lock()  # as BoundedCache.forked


def _forked() -> None:
    for cache in _caches.values():
        cache.forked()


os.register_at_fork(after_in_child=_forked)
