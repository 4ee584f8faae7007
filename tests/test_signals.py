"""Signals for a project's own alerting: request_denied, redis_unavailable and redis_available."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis
from django.test import RequestFactory

from ratelimit_app import engine, events
from ratelimit_app.models import Policy
from tests.helpers import check, make_policy, policy
from tests.test_metrics import own_outage_log  # noqa: F401  (the fixture)




@pytest.fixture(autouse=True)
def redis_known_available():
    events.availability.lost_at = None
    yield
    events.availability.lost_at = None


@pytest.fixture
def received():
    """Every signal of this module sent during the test, as (signal name, sender, kwargs)."""
    log = []

    def listen(name):
        def receiver(sender, signal, **kwargs):
            log.append((name, sender, kwargs))
        return receiver

    receivers = {signal: listen(name) for name, signal in (
        ("request_denied", events.request_denied), ("redis_unavailable", events.redis_unavailable),
        ("redis_available", events.redis_available),
    )}
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    yield log
    for signal, receiver in receivers.items():
        signal.disconnect(receiver)


NOW = 1_800_000_001.0  # one second into a window of 10 s and one of 600 s: the long one ends last


def denied_decisions(*policies):
    """Decisions of real calls: each policy denies its subject."""
    for compiled in policies:
        engine.decide([check(compiled)], now=NOW)  # fills each limit of 1
    return engine.decide([check(compiled) for compiled in policies], now=NOW).denied_by


# --- request_denied ----------------------------------------------------------------------------


def test_request_denied_tells_the_policy_subject_limit_and_retry_time(received):
    short, long = policy(limit=1, window=10, name="short-window"), policy(limit=1, window=600, name="long-window")
    request = RequestFactory().get("/search/")
    refused = denied_decisions(short, long)
    events.denied(request, refused)
    [(name, sender, sent)] = received
    assert (name, sender) == ("request_denied", Policy)
    # the policy that makes the client wait longest is the one that speaks
    assert (sent["policy"], sent["subject"], sent["limit"]) == ("long-window", "ip:203.0.113.7", 1)
    assert 10 < sent["retry_after"] <= 600
    assert sent["request"] is request
    assert [d.policy.name for d in sent["decisions"]] == ["short-window", "long-window"]


def test_async_views_send_request_denied_too(received):
    refused = denied_decisions(policy(limit=1, name="async-denied"))
    asyncio.run(events.adenied(RequestFactory().get("/"), refused))
    assert [(name, sent["policy"]) for name, _, sent in received] == [("request_denied", "async-denied")]


def test_a_failing_receiver_is_logged_and_does_not_break_the_request(caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("the alerting system is down")

    events.request_denied.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="ratelimit_app"):
            events.denied(RequestFactory().get("/"), denied_decisions(policy(limit=1)))
    finally:
        events.request_denied.disconnect(broken)
    assert "a receiver of request_denied failed" in caplog.text
    assert "the alerting system is down" in caplog.text


# --- redis_unavailable / redis_available -------------------------------------------------------


def test_redis_unavailable_then_available_are_sent_once_per_change(received):
    error = redis.ConnectionError("Connection refused")
    started = time.monotonic()
    events.breaker_opened(error)
    time.sleep(0.05)  # an outage this long at least
    for _ in range(2):  # every request while the circuit is open, and every failed retry
        events.breaker_opened(error)
    for _ in range(2):
        events.breaker_closed()
    events.breaker_closed()
    ended = time.monotonic()
    assert [(name, sender) for name, sender, _ in received] == [("redis_unavailable", None), ("redis_available", None)]
    assert received[0][2]["error"] is error
    # seconds since the first failure (not the last one, nor milliseconds), by the clock around it
    assert 0.05 <= received[1][2]["unavailable_for"] <= ended - started


def test_a_second_outage_is_sent_again(received):
    for _ in range(2):
        events.breaker_opened(redis.TimeoutError("Timeout"))
        events.breaker_closed()
    assert [name for name, _, _ in received] == ["redis_unavailable", "redis_available"] * 2


# --- through the doors (needs the wiring) -------------------------------------------------------


@pytest.mark.django_db
def test_a_denied_request_to_the_demo_sends_request_denied(client, received):
    make_policy(name="search-per-ip", action="demo:search", limit=2, key="ip")
    statuses = [client.get("/demo/search/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    [(name, _, sent)] = received
    assert (name, sent["policy"], sent["subject"], sent["limit"]) == ("request_denied", "search-per-ip", "ip:203.0.113.7", 2)
    assert 0 < sent["retry_after"] <= 60


@pytest.mark.django_db
def test_redis_going_down_and_coming_back_is_sent_once_each(client, received, settings, own_outage_log):
    make_policy(name="search-per-ip", action="demo:search", limit=5, key="ip")
    settings.RATELIMIT_BREAKER_SECONDS = 0  # every request tries Redis again
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    for _ in range(3):
        assert client.get("/demo/search/").status_code == 200  # fail open
    settings.RATELIMIT_CACHE = "default"
    for _ in range(2):
        client.get("/demo/search/")
    assert [name for name, _, _ in received] == ["redis_unavailable", "redis_available"]
    error = received[0][2]["error"]  # what an alert would show: the cause, naming the server
    assert isinstance(error, redis.ConnectionError) and "127.0.0.1:1" in str(error)
