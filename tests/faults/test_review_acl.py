"""Giving places back as an ACL user that may not run CLIENT (a managed Redis often forbids it): every
later decision on the same connections still reads its own reply, and the places go back."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import RedisCommandError, RedisUnavailable
from ratelimit_app.engine.circuit import PoolFull
from ratelimit_app.values import Held
from tests.helpers import check, in_threads, policy

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_client_command(settings, private):
    """The cache logs in as a user that may run everything but CLIENT."""
    admin = redis.Redis(port=private.port)
    admin.acl_setuser("limiter", enabled=True, passwords=["+limiter-secret"], keys=["*"],
                      commands=["+@all", "-client"])
    settings.CACHES = {**settings.CACHES, "limits": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": private.url,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25,
                    "USERNAME": "limiter", "PASSWORD": "limiter-secret"}}}
    settings.RATELIMIT_CACHE = "limits"
    yield admin
    admin.close()


def _held(admin: redis.Redis) -> int:
    return sum(admin.zcount(key, 0, "+inf") for key in admin.scan_iter(match="*:c*"))


def test_async_give_backs_without_the_client_command_leave_every_reply_to_its_own_call(no_client_command):
    """An in-flight limit of 1, taken and given back 200 times in one event loop, with a counter
    decided between: each decision answers for itself (a reply left by a give-back would answer the
    next call)."""
    inflight = check(policy(strategy="concurrency", limit=1, window=60))
    counter = policy(limit=1000)
    failures_before = engine.breaker.failures

    async def answered(*args, **kwargs) -> bool:
        try:
            return (await engine.adecide(*args, **kwargs)).allowed
        except (RedisCommandError, RedisUnavailable):
            return False  # another call's reply, or none

    async def rounds() -> list[bool]:
        answers = []
        for n in range(200):
            answers.append(await answered([inflight], lease=f"lease-{n}"))
            await engine.arelease([Held(inflight.policy, inflight.subject, f"lease-{n}", 1)])
            answers.append(await answered([check(counter)]))
        return answers

    answers = asyncio.run(rounds())
    assert answers.count(False) == 0, f"{answers.count(False)} of 400 calls without their own answer"
    assert engine.breaker.failures == failures_before
    assert _held(no_client_command) == 0


def _waited_for_the_pool(error: BaseException) -> bool:
    return isinstance(error.__cause__, (PoolFull, redis.exceptions.MaxConnectionsError))


def test_sync_give_backs_on_pooled_connections_without_the_client_command(no_client_command, settings):
    """Threads past half the pool borrow a connection per call: what a give-back leaves on it must
    not answer the next decision."""
    settings.CACHES["limits"]["OPTIONS"]["CONNECTION_POOL_KWARGS"] = {"max_connections": 2}
    inflight = check(policy(strategy="concurrency", limit=100, window=60), "ip:203.0.113.9")
    counter = policy(limit=100000)
    failures_before = engine.breaker.failures

    def answered(*args, **kwargs) -> bool:
        try:
            return engine.decide(*args, **kwargs).allowed
        except RedisCommandError as error:
            # a call that waited past the socket timeout for one of the 2 connections (a busy machine) had no
            # answer, nobody else's either: the pool's back-pressure, not a reply left behind
            return _waited_for_the_pool(error)
        except RedisUnavailable:
            return False  # another call's reply, or none

    def rounds() -> int:
        refused = 0
        for n in range(100):
            lease = f"{threading.get_ident()}-{n}"
            refused += not answered([inflight], lease=lease)
            engine.release([Held(inflight.policy, inflight.subject, lease, 1)])
            refused += not answered([check(counter)])
        return refused

    results, errors = in_threads(rounds, threads=4)
    assert errors == []
    assert sum(results) == 0, f"{sum(results)} of 800 calls without their own answer"
    assert engine.breaker.failures == failures_before
    assert _held(no_client_command) == 0
