"""The rate limiter's cache and its connections across threads and settings changes, on real servers:
what a pool of the engine's own, made apart from django-redis's, would break.

Each test asserts what a user sees: the data one cache alias holds, or the connections a server counts
(CLIENT LIST), never elapsed time."""

from __future__ import annotations

import gc
import threading

import pytest
import redis
from django.core.cache import caches
from django.test import override_settings

from ratelimit_app import engine
from tests.cluster import LocalSentinel
from tests.helpers import check, policy
from tests.test_sentinel import sentinel_cache

pytestmark = pytest.mark.django_db


def redis_cache(url: str, **options: object) -> dict:
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url, "OPTIONS": options}


def connections(port: int) -> int:
    """The clients the server on `port` counts (CLIENT LIST), the one asking left out; garbage collected
    first, so that only sockets something still holds are counted."""
    gc.collect()
    asking = redis.Redis(port=port)
    try:
        return len(asking.client_list()) - 1
    finally:
        asking.close()


def test_one_cache_alias_holds_the_same_data_in_every_thread(settings, private):
    """The README's "a cache of its own" on the site's Redis, in a database of its own (db 2 through
    CONNECTION_POOL_KWARGS: the LOCATION is the site's; W008 says so). Whatever django-redis makes of
    that, a value the alias stores in one thread must be found by the alias in another (a client of the
    engine's own, installed for the thread that decided, split it over two databases)."""
    url = f"redis://127.0.0.1:{private.port}"  # no database in the URL: CONNECTION_POOL_KWARGS chooses it
    settings.CACHES = {**settings.CACHES, "site": redis_cache(url),
                       "limits": redis_cache(url, SOCKET_CONNECT_TIMEOUT=0.5, SOCKET_TIMEOUT=0.5,
                                             CONNECTION_POOL_KWARGS={"db": 2})}
    settings.RATELIMIT_CACHE = "limits"
    caches["site"].set("greeting", "hello")  # the site's cache made django-redis's pool of this LOCATION
    assert engine.decide([check(policy(limit=5))]).allowed  # a request of this thread was decided
    caches["limits"].set("feature-flag", "on")  # the site's own use of the alias, in the same thread

    seen = []
    reader = threading.Thread(target=lambda: seen.append(caches["limits"].get("feature-flag", "missing")))
    reader.start()
    reader.join()
    assert seen == ["on"], "the alias's value, stored by one thread, is missing in another"


def test_a_thread_ending_after_the_cache_settings_changed_leaves_no_socket_open(settings, private):
    """A worker thread that decided keeps a connection; the cache settings change (override_settings, as
    a test suite does it) while it lives, and it ends afterwards. Its connection goes back to the old
    pool, which nothing uses any more: it must be closed, not kept open for the rest of the process."""
    compiled = policy(limit=10**6)
    counted = []
    for round_ in range(8):
        done = threading.Event()

        def work() -> None:
            engine.decide([check(compiled)])
            done.wait()

        options = {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5 + round_ / 100}  # settings that differ
        with override_settings(CACHES={**settings.CACHES, "limits": redis_cache(private.url, **options)},
                               RATELIMIT_CACHE="limits"):
            engine.decide([check(compiled)])
            worker = threading.Thread(target=work)
            worker.start()
        done.set()  # the worker ends after the settings changed back
        worker.join()
        counted.append(connections(private.port))
    assert counted[-1] <= counted[1] + 1, f"sockets open on the server after each round: {counted}"


@pytest.fixture
def sentinel():
    started = LocalSentinel()
    yield started
    started.stop()
    engine.breaker.reset()


def test_changing_the_cache_settings_leaves_no_connection_to_the_sentinel_open(settings, sentinel):
    """RATELIMIT_CACHE through Redis Sentinel (docs/howto/cluster-sentinel.md), its settings changed again
    and again (override_settings in a test suite), with a decision each time: the sentinel must not count
    one more client per change (a pool made per change, each with its sentinel manager, did)."""
    compiled = policy(limit=10**6)
    counted = []
    for round_ in range(8):
        cache = sentinel_cache(sentinel)
        cache["OPTIONS"]["SOCKET_TIMEOUT"] = 0.25 + round_ / 100  # settings that differ
        with override_settings(CACHES={**settings.CACHES, "sentinel": cache}, RATELIMIT_CACHE="sentinel"):
            assert engine.decide([check(compiled)]).allowed
        counted.append(connections(sentinel.sentinel.port))
    assert counted[-1] <= counted[1] + 1, f"clients of the sentinel after each change: {counted}"
