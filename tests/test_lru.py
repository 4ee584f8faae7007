"""Caches keyed by what clients send stay within their byte budget."""

from __future__ import annotations

from ratelimit_app.lru import ENTRY_OVERHEAD, byte_bounded_cache


def test_long_values_are_computed_and_never_kept():
    calls = []

    @byte_bounded_cache(1 << 20, max_chars=256)
    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    huge = "h" * (1 << 20)
    assert length(huge) == length(huge) == 1 << 20
    assert len(calls) == 2 and length.cache_info().currsize == 0
    assert length("abc") == length("abc") == 3
    assert len(calls) == 3 and length.cache_info().currsize == 1


def test_the_entries_kept_fit_the_byte_budget():
    @byte_bounded_cache(64 * 1024, max_chars=100)
    def echo(text: str) -> str:
        return text

    for i in range(10_000):
        echo(f"{i:0100d}"[-100:])
    info = echo.cache_info()
    assert info.currsize == info.maxsize
    assert info.maxsize * (ENTRY_OVERHEAD + 4 * 100) <= 64 * 1024


def test_cache_clear_forgets():
    @byte_bounded_cache(64 * 1024)
    def upper(text: str) -> str:
        return text.upper()

    upper("a")
    upper.cache_clear()
    assert upper.cache_info().currsize == 0
