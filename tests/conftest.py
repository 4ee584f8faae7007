"""A real Redis for the whole session (REDIS_URL, or a private server started here), emptied per test."""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django_redis import get_redis_connection

from project.devredis import PrivateRedis
from ratelimit_app import connection, policies, registry
from ratelimit_app.deny_cache import deny_cache
from ratelimit_app.tally import tally

_private: PrivateRedis | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Point the cache at the server before anything connects (settings were read already)."""
    global _private
    if not os.environ.get("REDIS_URL"):
        _private = PrivateRedis().start()
        os.environ["REDIS_URL"] = _private.url  # for subprocesses the tests start
    settings.CACHES["default"]["LOCATION"] = os.environ["REDIS_URL"]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _private:
        _private.stop()


@pytest.fixture
def redis_client():
    return get_redis_connection("default")


@pytest.fixture(autouse=True)
def empty_redis(redis_client):
    """Every test starts from an empty Redis, a closed circuit, no refusals in memory and a policy
    index to be reloaded."""
    deny_cache.clear()  # a reload does not always clear it, and the database may give a new policy an old id
    # counts of the test before, whose totals are gone with its Redis: a background flush sending
    # some now is waited for, so that nothing of it lands after the flush of the database
    with tally._flushing:
        tally.discard()
        redis_client.flushdb()
    connection.breaker.reset()
    policies._state.stale = True
    registry.forget_synced()  # the rows written for the test before were rolled back with it
    yield
    policies._state.stale = True


@pytest.fixture
def private():
    """A Redis server of the test's own, started and stopped with it (the app does not use it unless told)."""
    server = PrivateRedis().start()
    yield server
    server.stop()


@pytest.fixture
def server(settings, private):
    """A Redis of the test's own that the app uses, which the test may pause, stop and start again."""
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": private.url}}
    settings.RATELIMIT_CACHE = "own"
    return private


@pytest.fixture
def outage_forgotten():
    """The outage a test causes is not the one the next test's log should be quiet about."""
    yield
    from ratelimit_app import limiter

    limiter.outage._logged_at = 0.0
    connection.breaker.reset()
