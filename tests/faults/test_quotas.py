"""Calendar quotas through the loss of Redis, on real servers: a month of usage survives a FLUSHALL and
a restart of a server that saves nothing, less at most what the last save interval had not saved."""

from __future__ import annotations

import pytest
import redis

from project.devredis import PrivateRedis
from ratelimit_app import engine, quotas
from ratelimit_app.models import QuotaUsage
from ratelimit_app.policies import compile_policy
from tests.cluster import wait_for
from tests.helpers import check, make_policy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def monthly(limit: int = 10):
    return compile_policy(make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=limit, window=1))


def saved_by_the_worker(used: int) -> None:
    """The worker's own saver (a thread, every RATELIMIT_QUOTA_SAVE_SECONDS) has written `used`."""
    wait_for(lambda: QuotaUsage.objects.filter(used=used).exists(), 10, f"usage {used} to be saved")


def test_a_restart_of_redis_that_saves_nothing_keeps_the_months_usage(settings, server):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 0.2
    limited = monthly()
    assert [engine.decide([check(limited)], cost=3).allowed for _ in range(2)] == [True, True]
    saved_by_the_worker(6)
    server.stop()
    restarted = PrivateRedis(port=server.port).start()  # empty: the server kept nothing
    try:
        assert not engine.decide([check(limited)], cost=5).allowed  # 6 + 5 > 10
        assert engine.decide([check(limited)], cost=4).allowed
        assert not engine.decide([check(limited)]).allowed
        saved_by_the_worker(10)
        print("restart: 6 of 10 used and saved; after the restart 5 refused, 4 admitted, 1 refused; 10 saved")
    finally:
        restarted.stop()


def test_a_flushall_keeps_the_months_usage(settings, server):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 0.2
    limited = monthly()
    assert engine.decide([check(limited)], cost=6).allowed
    saved_by_the_worker(6)
    redis.Redis.from_url(server.url).flushall()
    admitted = [engine.decide([check(limited)]).allowed for _ in range(5)]
    assert admitted == [True, True, True, True, False]
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 10
    print(f"FLUSHALL: 6 of 10 used and saved; after it {sum(admitted)} of 5 admitted, counted 10")
