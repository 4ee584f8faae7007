"""Least-recently-used caches bounded by bytes, for caches keyed by what clients send.

functools.lru_cache bounds the number of entries: 8,192 entries keyed by 2 MB strings hold 16 GB.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from functools import wraps
from typing import Any, Callable, Hashable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
ENTRY_OVERHEAD = 160  # bytes an entry costs besides its key and value: the dict slot, the list node, the tuples
_MISSING = object()


def size_of(value: object) -> int:
    """Bytes held by a string, bytes or a tuple of them (nested); other values by their own size."""
    if isinstance(value, tuple):
        return sys.getsizeof(value) + sum(size_of(item) for item in value)
    return sys.getsizeof(value)


class ByteBoundedLRU:
    """A mapping that forgets its least recently used entries beyond `max_bytes` (keys and values counted).

    An entry larger than `max_bytes // 64` is never kept: one huge value sent by a client must not
    evict everything else, and it costs nothing to compute it again. Thread-safe.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes // 64
        self.bytes = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return default
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, size: int | None = None) -> None:
        size = ENTRY_OVERHEAD + (size_of(key) + size_of(value) if size is None else size)
        if size > self.max_entry_bytes:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self.bytes -= previous[1]
            self._entries[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.bytes -= freed

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


def byte_bounded_cache(max_bytes: int) -> Callable[[F], F]:
    """Like functools.lru_cache, but bounded by the bytes of the arguments and results it keeps.

    Arguments too large to keep skip the cache before they are hashed (hashing 2 MB costs as much
    as most computations). The decorated function gains `cache` and `cache_clear()`.
    """

    def decorate(function: F) -> F:
        cache = ByteBoundedLRU(max_bytes)

        @wraps(function)
        def cached(*args: Any) -> Any:
            if _too_large(args, cache.max_entry_bytes):
                return function(*args)
            result = cache.get(args, _MISSING)
            if result is _MISSING:
                result = function(*args)
                cache.put(args, result)
            return result

        cached.cache = cache  # type: ignore[attr-defined]
        cached.cache_clear = cache.clear  # type: ignore[attr-defined]
        return cached  # type: ignore[return-value]

    return decorate


def _too_large(args: tuple, limit: int) -> bool:
    # len() is free where size_of() on a miss is not; a character takes at most 4 bytes
    return sum(len(arg) for arg in args if isinstance(arg, (str, bytes))) * 4 > limit and size_of(args) > limit
