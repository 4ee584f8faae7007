"""Redis outages: fail open (or closed) without hanging requests, and resume by themselves."""

from __future__ import annotations

import time

import pytest
from django.core.checks import run_checks

from project.devredis import PrivateRedis
from ratelimit_app import connection
from ratelimit_app.models import Policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


@pytest.fixture
def server(settings):
    """A Redis of this test's own, which the test may stop and start again; the app uses it."""
    private = PrivateRedis().start()
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": private.url}}
    settings.RATELIMIT_CACHE = "own"
    yield private
    private.stop()


@pytest.fixture
def limited(db):
    policy = Policy(name="search-per-ip", action="demo:search", limit=1, window=60, strategy="fixed_window", key="ip")
    policy.full_clean()
    policy.save()
    return policy


def search(client):
    return client.get("/demo/search/?q=a", REMOTE_ADDR=IP)


def restart(server: PrivateRedis) -> PrivateRedis:
    server.stop()
    return PrivateRedis(port=server.port).start()


def until_limited(client, timeout=10.0) -> float:
    """Seconds until a request is denied again (limiting has resumed)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if search(client).status_code == 429:
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError("limiting did not resume")


def test_fail_open_lets_requests_through_without_waiting_and_resumes(client, server, limited, caplog):
    assert [search(client).status_code for _ in range(2)] == [200, 429]
    server.stop()
    started = time.monotonic()
    statuses = [search(client).status_code for _ in range(50)]
    elapsed = time.monotonic() - started
    assert statuses == [200] * 50
    assert elapsed < 5  # generous: refused connections fail at once and the open circuit costs nothing
    assert caplog.text.count("Redis unavailable") <= 2  # once per interval, not per request

    back = PrivateRedis(port=server.port).start()
    try:
        recovery = until_limited(client)
    finally:
        back.stop()
    print(f"\nfail open: 50 requests in {elapsed:.3f}s while down; limiting resumed {recovery:.2f}s after Redis returned")
    assert recovery < 2.5  # the breaker half-opens after RATELIMIT_BREAKER_SECONDS (1 s)


def test_fail_closed_answers_503_with_retry_after_and_resumes(client, server, limited, settings):
    settings.RATELIMIT_FAIL_OPEN = False
    assert search(client).status_code == 200
    server.stop()
    refused = [search(client) for _ in range(20)]
    assert {r.status_code for r in refused} == {503}
    assert all(r.headers["Retry-After"] == "1" for r in refused)
    back = PrivateRedis(port=server.port).start()
    try:
        recovery = until_limited(client)
    finally:
        back.stop()
    assert recovery < 2.5


def test_a_restart_between_requests_reaches_no_request(client, server, limited, settings):
    settings.RATELIMIT_FAIL_OPEN = False  # any error would show as a 503
    assert search(client).status_code == 200
    back = restart(server)
    try:
        assert [search(client).status_code for _ in range(2)] == [200, 429]  # restarted empty
    finally:
        back.stop()


def test_script_flush_mid_run_reaches_no_request(client, server, limited, settings):
    settings.RATELIMIT_FAIL_OPEN = False
    assert search(client).status_code == 200
    connection.client().script_flush()
    assert search(client).status_code == 429


def test_a_port_with_nothing_listening_fails_open_at_once(client, settings, limited):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    started = time.monotonic()
    assert {search(client).status_code for _ in range(30)} == {200}
    assert time.monotonic() - started < 5


def test_missing_socket_timeouts_are_reported_by_a_system_check(settings):
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}
    assert "ratelimit_app.W002" in [message.id for message in run_checks()]


def test_a_cache_that_is_not_redis_is_an_error(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert "ratelimit_app.E002" in [message.id for message in run_checks()]
