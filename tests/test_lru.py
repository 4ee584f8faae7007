"""The byte-bounded LRU cache: what clients send cannot grow a process beyond its budget."""

from __future__ import annotations

import threading

from ratelimit_app.lru import ByteBoundedLRU, byte_bounded_cache, size_of


def test_entries_beyond_the_budget_evict_the_least_recently_used():
    cache = ByteBoundedLRU(64 * 1024)
    for i in range(1000):
        cache.put(f"key-{i}", i)
    assert cache.bytes <= 64 * 1024
    assert cache.get("key-999") == 999 and cache.get("key-0") is None
    kept = len(cache)
    cache.get(f"key-{1000 - kept}")  # the oldest entry, used again
    cache.put("newcomer", 1)
    assert cache.get(f"key-{1000 - kept}") is not None and cache.get(f"key-{1001 - kept}") is None


def test_an_entry_too_large_is_never_kept():
    cache = ByteBoundedLRU(64 * 1024)
    cache.put("small", 1)
    cache.put("x" * 2048, 2)  # more than 1/64 of the budget
    assert cache.get("x" * 2048) is None and cache.get("small") == 1


def test_the_decorated_function_is_bounded_and_still_answers():
    calls = []

    @byte_bounded_cache(256 * 1024)
    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    assert length("abc") == length("abc") == 3
    assert len(calls) == 1
    huge = "h" * (1 << 20)
    assert length(huge) == length(huge) == 1 << 20
    assert len(calls) == 3  # computed each time, never kept
    assert length.cache.bytes < 1024
    length.cache_clear()
    assert length("abc") == 3 and len(calls) == 4


def test_a_none_result_is_cached_too():
    calls = []

    @byte_bounded_cache(64 * 1024)
    def nothing(text: str) -> None:
        calls.append(text)

    nothing("a"), nothing("a")
    assert calls == ["a"]


def test_sizes_count_what_the_strings_hold():
    assert size_of("é" * 1000) > size_of("e" * 1000) > 1000
    assert size_of(("a" * 100, ("b" * 100,))) > 200


def test_threads_never_break_it():
    cache = ByteBoundedLRU(16 * 1024)

    def churn(offset: int) -> None:
        for i in range(2000):
            cache.put(f"{offset}-{i}", i)
            cache.get(f"{offset}-{i - 1}")

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.bytes <= 16 * 1024 and cache.bytes == sum(size for _, size in cache._entries.values())
