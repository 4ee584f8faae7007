"""Caches keyed by what clients send, bounded in bytes rather than in entries.

functools.lru_cache bounds the number of entries: 8,192 entries keyed by 2 MB strings hold 16 GB.
"""

from __future__ import annotations

from functools import lru_cache, wraps
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
# what an entry of functools.lru_cache costs besides its key's characters: the link, the key tuple,
# the dict slot, a small result (a Subject, an address, a few URL names)
ENTRY_OVERHEAD = 512


def byte_bounded_cache(max_bytes: int, max_chars: int = 256) -> Callable[[F], F]:
    """functools.lru_cache kept within `max_bytes`: a call whose first argument (the value a client
    sent: a header, a parameter, a path) is longer than `max_chars` is computed and never kept, so
    every entry costs at most ENTRY_OVERHEAD + 4 * max_chars bytes and the cache holds
    max_bytes // that many. A long value costs a computation, never memory, and evicts nothing.

    The decorated function keeps lru_cache's `cache_info()` and `cache_clear()`.
    """
    entries = max(1, max_bytes // (ENTRY_OVERHEAD + 4 * max_chars))  # 4: the widest character

    def decorate(function: F) -> F:
        cached = lru_cache(maxsize=entries)(function)

        @wraps(function)
        def bounded(value: Any, *args: Any) -> Any:
            if len(value) > max_chars:
                return function(value, *args)
            return cached(value, *args)

        bounded.cache_info = cached.cache_info  # type: ignore[attr-defined]
        bounded.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        return bounded  # type: ignore[return-value]

    return decorate
