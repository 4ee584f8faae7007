"""The asyncio client's kept connections when the server goes away as a whole: Redis restarted, a
Sentinel failover demoting the master. The promise: the loop's decisions follow, none failing open
once the server is back, each counted once."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import RedisCommandError, RedisUnavailable
from tests.faults.test_connections import QUEUED, use_server
from tests.faults.test_review_kept import _held
from tests.helpers import check
from tests.helpers import policy as any_policy

pytestmark = pytest.mark.django_db


def _restart(private) -> None:
    admin = redis.Redis(port=private.port)
    try:
        admin.execute_command("DEBUG", "RESTART")
    except redis.ConnectionError:
        pass  # it closed this connection too
    admin.close()
    for _ in range(100):
        try:
            redis.Redis(port=private.port).ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)


def test_decisions_after_a_restart_of_redis_with_connections_kept_do_not_fail_open(settings, private):
    """Redis restarts while the loop keeps 2 connections: the next decisions reconnect, none fails open,
    and each counts once."""
    use_server(settings, private.url, timeouts=QUEUED, max_connections=2)
    limits = any_policy(strategy="sliding_log", limit=100, window=3600)
    who = check(limits, "ip:203.0.113.14")

    async def run() -> list:
        await asyncio.gather(*(engine.adecide([who]) for _ in range(2)))
        _restart(private)
        await asyncio.sleep(0.1)  # the loop reads the ends of file of the connections it keeps
        return await asyncio.gather(*(engine.adecide([who]) for _ in range(4)), return_exceptions=True)

    verdicts = asyncio.run(run())
    assert [getattr(verdict, "allowed", verdict) for verdict in verdicts] == [True] * 4
    assert _held(limits, "ip:203.0.113.14") == 4  # the restarted Redis, without the first 2 (no persistence)


def _failover(started) -> bool:
    try:
        started.sentinel.client.execute_command("SENTINEL", "FAILOVER", started.service)
        return True
    except redis.ResponseError:  # NOGOODSLAVE: the sentinel has not yet seen the replica fit to promote
        time.sleep(0.2)
        return False


@pytest.mark.slow
def test_connections_kept_across_a_sentinel_failover_follow_the_new_master(settings):
    """SENTINEL FAILOVER while a loop keeps connections to the master: the demoted master closes them,
    and within a bounded number of decisions the loop decides on the promoted replica."""
    from tests.cluster import LocalSentinel, wait_for
    from tests.test_sentinel import sentinel_cache

    started = LocalSentinel()
    try:
        settings.CACHES = {**settings.CACHES, "sentinel": sentinel_cache(started)}
        settings.RATELIMIT_CACHE = "sentinel"
        limits = any_policy(strategy="sliding_log", limit=100000, window=3600)
        who = check(limits, "ip:203.0.113.16")
        old = started.master_port()

        async def run() -> tuple[int, int]:
            await asyncio.gather(*(engine.adecide([who]) for _ in range(3)))
            await asyncio.to_thread(wait_for, lambda: _failover(started), 30, "a replica to promote")
            await asyncio.to_thread(wait_for, lambda: started.master_port() != old, 30, "the failover")
            failed = answered = 0
            for _ in range(400):
                try:
                    await engine.adecide([who])
                    answered += 1
                except (RedisUnavailable, RedisCommandError):
                    failed += 1
                    answered = 0
                if answered == 20:
                    break
                await asyncio.sleep(0.02)
            return answered, failed

        answered, failed = asyncio.run(run())
        assert answered == 20, failed
        assert started.master_port() != old
    finally:
        started.stop()
        engine.breaker.reset()
