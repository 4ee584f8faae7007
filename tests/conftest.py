"""A real Redis for the whole session (REDIS_URL, or a private server started here), emptied per test."""

from __future__ import annotations

import os
import time

import pytest
from django.conf import settings
from django_redis import get_redis_connection
from django_redis.pool import ConnectionFactory

from project.devredis import PrivateRedis
from ratelimit_app import testing
from ratelimit_app.connection import ClusterConnectionFactory

_private: PrivateRedis | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Point the cache at the server before anything connects (settings were read already)."""
    global _private
    if not os.environ.get("REDIS_URL"):
        _private = PrivateRedis().start()
        os.environ["REDIS_URL"] = _private.url  # for subprocesses the tests start
    settings.CACHES["default"]["LOCATION"] = os.environ["REDIS_URL"]
    # users made by tests log in without a million rounds of PBKDF2 each (servers the tests start keep the default)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The order the tests ran in, printed last (even with -q): a failure that depends on it replays."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed")
        terminalreporter.write_line(f"Tests ran in random order: --randomly-seed={seed} replays it (-p no:randomly: file order).")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _private:
        _private.stop()


@pytest.fixture
def redis_client():
    return get_redis_connection("default")


@pytest.fixture(autouse=True)
def away_from_a_minute_boundary():
    """Most tests count in 60 s fixed windows on the server's clock: one that starts in a window's last
    second waits for the next, or its counts would start over mid-test (window edges have tests of their own)."""
    left = 60 - time.time() % 60
    if left < 1:
        time.sleep(left + 0.05)


@pytest.fixture(autouse=True)
def empty_redis(redis_client):
    """Every test starts from an empty Redis and a process that remembers nothing of the test before
    (index, refusals, circuit, logs, clients, code policies written to a rolled-back database)."""
    testing.reset()  # waits for a flush of the totals under way: nothing of it lands after the FLUSHDB
    redis_client.flushdb()
    pools_before, clusters_before = set(ConnectionFactory._pools), set(ClusterConnectionFactory._clusters)
    yield
    testing.reset()
    # django-redis keeps a pool per LOCATION for the whole process, options and credentials included (and
    # the cluster factory a client): a later test whose server got the same free port would reuse one made
    # for another server, e.g. logging in as an ACL user it lacks. What a test made goes with it.
    for url in set(ConnectionFactory._pools) - pools_before:
        ConnectionFactory._pools.pop(url).disconnect()
    for url in set(ClusterConnectionFactory._clusters) - clusters_before:
        ClusterConnectionFactory._clusters.pop(url).disconnect_connection_pools()


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
    testing.reset()
