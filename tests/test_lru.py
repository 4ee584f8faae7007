"""Caches keyed by what clients send stay within their byte budget."""

from __future__ import annotations

import collections
import functools
import importlib
import pkgutil
import threading
import weakref

import pytest

import ratelimit_app
from ratelimit_app.conf import DEFAULTS
from ratelimit_app import lru
from ratelimit_app.loggate import LogGate
from ratelimit_app.lru import ENTRY_OVERHEAD, byte_bounded_cache


@pytest.fixture(autouse=True)
def declared(monkeypatch):
    """A test's own cache, "tests.cache", with all of RATELIMIT_CACHE_BYTES, forgotten after the test."""
    monkeypatch.setitem(lru.BUDGETS, "tests.cache", 1.0)
    monkeypatch.setattr(lru, "_caches", dict(lru._caches))


def test_long_values_are_computed_and_never_kept():
    calls = []

    @byte_bounded_cache(1 << 20, max_chars=256, name="tests.cache")
    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    huge = "h" * (1 << 20)
    assert length(huge) == length(huge) == 1 << 20
    assert len(calls) == 2 and length.cache_info().currsize == 0
    assert length("abc") == length("abc") == 3
    assert len(calls) == 3 and length.cache_info().currsize == 1


def test_the_entries_kept_fit_the_byte_budget():
    @byte_bounded_cache(64 * 1024, max_chars=100, name="tests.cache")
    def echo(text: str) -> str:
        return text

    for i in range(10_000):
        echo(f"{i:0100d}"[-100:])
    info = echo.cache_info()
    assert info.currsize == info.maxsize
    assert info.maxsize * (ENTRY_OVERHEAD + 4 * 100) <= 64 * 1024


def test_cache_clear_forgets():
    @byte_bounded_cache(64 * 1024, name="tests.cache")
    def upper(text: str) -> str:
        return text.upper()

    upper("a")
    upper.cache_clear()
    assert upper.cache_info().currsize == 0


# --- one accounting for every cache of the process ------------------------------------------------

# What a process keeps that is no cache, and why it stays bounded without a share of RATELIMIT_CACHE_BYTES:
# (module-level name, or name.attribute of a module-level object). A cache goes through ratelimit_app.lru.
NOT_CACHES = {
    "_cache": "the settings read: one entry per setting",
    "_caches": "the registry of caches itself",
    "_async_clients": "one asyncio client per running event loop, dropped with it",
    "_on_flush": "callbacks registered once, at import",
    "_cluster_types": "one entry per Redis client class",
    "_kept": "weak references: the clients keeping a connection, by pool",
    "_pinned": "one client per thread, dropped with it",
    "_reading": "reads of give-backs' replies under way",
    "_without_functions": "weak references: the servers without Functions",
    "_keys": "metrics' records, folded within FOLD_SECONDS",
    "_seconds": "metrics' records, folded within FOLD_SECONDS",
    "scripts._sources": "one Lua source per entry point",
    "scripts._entries": "one per entry point and client class",
    "owed.places": "in-flight places owed back to Redis, given back once it answers",
    "carried._waiting": "the kept connections (one a thread) whose settled usage waits for their next write; a timer empties it within a second",
    "tally._noted": "decisions waiting for the next flush: MOST_NOTED at most",
    "tally._counted": "decisions waiting for the next flush: MOST_NOTED at most",
    "saver._pending": "quota usage waiting for the next save: KEPT_WHILE_REFUSED at most while it fails",
    "_registry.declared": "what the code declares: as many as the code has",
    "_registry.providers": "what the code declares: as many as the code has",
    "_registry.written": "what the code declares: as many as the code has",
    "_registry.costs": "what the code declares: as many as the code has",
    "_registry.by_view": "what the code declares: as many as the code has",
    "_registry.listeners": "what the code declares: as many as the code has",
    "faults.counts": "the limiter's own errors: one entry per kind (exception class)",
    "faults.last": "the limiter's own errors: one entry per kind (exception class)",
    "faults._said._at": "log gates: one entry per kind of failure (class of error, signal name)",
}
CONTAINERS = (dict, set, list, collections.deque, weakref.WeakKeyDictionary, weakref.WeakValueDictionary,
              weakref.WeakSet, threading.local)


def _modules():
    for found in pkgutil.walk_packages(ratelimit_app.__path__, "ratelimit_app."):
        if ".migrations." not in found.name:
            yield importlib.import_module(found.name)


def test_every_cache_the_process_keeps_is_bounded_by_the_one_accounting():
    """A module-level dict, lru_cache or container that is not a declared cache fails this test: a new cache
    takes a share of RATELIMIT_CACHE_BYTES (lru.BUDGETS), or says here why it needs none."""
    modules = list(_modules())
    registered = lru.caches()
    del lru.BUDGETS["tests.cache"]  # this test's own
    undeclared, seen = [], set()
    for module in modules:
        for name, value in vars(module).items():
            if name.startswith("__") or id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, functools._lru_cache_wrapper):
                undeclared.append(f"{module.__name__}.{name}: functools.lru_cache")
            elif isinstance(value, type) and value.__module__ == module.__name__:
                undeclared += [f"{module.__name__}.{name}.{attribute}: functools.lru_cache"
                               for attribute, member in vars(value).items()
                               if isinstance(member, functools._lru_cache_wrapper)]
            elif isinstance(value, CONTAINERS) and not name.isupper() and name not in NOT_CACHES:
                undeclared.append(f"{module.__name__}.{name}: {type(value).__name__}")
            elif type(value).__module__.startswith("ratelimit_app") and hasattr(value, "__dict__"):
                cached = getattr(value, "cache_info", None)
                if cached is not None and getattr(cached, "__self__", None) not in registered.values():
                    undeclared.append(f"{module.__name__}.{name}: a cache outside ratelimit_app.lru")
                if isinstance(value, (type, LogGate)) or value in registered.values():
                    continue  # a log gate keeps one number per kind of failure (loggate.py)
                undeclared += [f"{module.__name__}.{name}.{attribute}: {type(member).__name__}"
                               for attribute, member in vars(value).items()
                               if isinstance(member, CONTAINERS) and f"{name}.{attribute}" not in NOT_CACHES]
    assert undeclared == []
    assert set(registered) == set(lru.BUDGETS)  # every share is used, by one cache
    assert sum(lru.BUDGETS.values()) <= 1


def test_a_cache_without_a_share_cannot_be_made():
    with pytest.raises(LookupError, match="BUDGETS"):
        lru.BoundedCache("tests.undeclared", lambda key, value: 0)

    with pytest.raises(LookupError, match="BUDGETS"):
        @byte_bounded_cache()
        def undeclared(text: str) -> str:
            return text


def test_a_bounded_cache_keeps_its_share_in_bytes_and_forgets_the_oldest_first(settings):
    settings.RATELIMIT_CACHE_BYTES = 1 << 20
    cache = lru.caches()["ratelimit_app.strategies.periods"]
    budget = cache.budget()
    texts = [f"{i:0200d}" for i in range(2 * budget // 200)]
    for text in texts:
        cache.put(("day", text), (None, text))
        cache.get(("day", texts[-1])) or cache.put(("day", texts[-1]), (None, texts[-1]))  # one kept busy
    assert 0 < cache.held() <= budget
    assert ("day", texts[0]) not in cache and ("day", texts[-2]) in cache
    cache.put(("day", "huge"), (None, "h" * 2 * budget))  # larger than the whole share: not kept
    assert ("day", "huge") not in cache and cache.held() <= budget
    cache.clear()
    assert cache.held() == 0 and len(cache) == 0


@pytest.mark.parametrize("value", ["32MB", -1, 1.5, True])
def test_a_cache_size_that_is_no_number_of_bytes_is_not_used(settings, caplog, value):
    settings.RATELIMIT_CACHE_BYTES = value
    assert lru.total() == DEFAULTS["RATELIMIT_CACHE_BYTES"]
    assert "RATELIMIT_CACHE_BYTES" in caplog.text and "ratelimit_app.E021" in caplog.text
