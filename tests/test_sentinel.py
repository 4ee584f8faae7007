"""Redis Sentinel, for real: a master, its replica and a sentinel started locally, reached through
django-redis's SentinelClient; the master dies and limiting follows the promoted replica."""

from __future__ import annotations


import pytest

from ratelimit_app import engine, live
from ratelimit_app.policies import compile_policy
from tests.cluster import LocalSentinel, until_limited_again, wait_replicated
from tests.helpers import check, make_policy, policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


def sentinel_cache(sentinel: LocalSentinel) -> dict:
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{sentinel.service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": [("127.0.0.1", sentinel.sentinel.port)],
            "SOCKET_CONNECT_TIMEOUT": 0.25,
            "SOCKET_TIMEOUT": 0.25,
        },
    }


@pytest.fixture
def sentinel(settings):
    started = LocalSentinel()
    settings.CACHES = {**settings.CACHES, "sentinel": sentinel_cache(started)}
    settings.RATELIMIT_CACHE = "sentinel"
    yield started
    started.stop()
    engine.breaker.reset()


def search(client) -> int:
    return client.get("/demo/search/?q=a", REMOTE_ADDR=IP).status_code


def test_the_engine_and_the_live_page_work_through_the_sentinel(sentinel):
    limited = policy(limit=2)
    assert [engine.decide([check(limited)]).allowed for _ in range(3)] == [True, True, False]
    assert engine.client().connection_pool.connection_kwargs.get("port") is None  # the sentinel finds the master
    assert sentinel.master.client.dbsize() > 0
    usage = live.live_usage(limited)
    assert (usage.allowed, usage.denied, [s.count for s in usage.subjects]) == (2, 1, [2])


@pytest.mark.slow
@pytest.mark.parametrize("fail_open", [True, False])
def test_limiting_resumes_on_the_promoted_replica_without_over_admitting(client, sentinel, settings, fail_open):
    settings.RATELIMIT_FAIL_OPEN = fail_open
    row = make_policy(name="search-per-ip", action="demo:search", limit=3, window=3600)
    assert [search(client) for _ in range(3)] == [200, 200, 200]  # at the limit
    wait_replicated(sentinel.master, sentinel.replica)  # the replica has every count before the crash
    sentinel.master.crash()
    meanwhile, resumed = until_limited_again(lambda: search(client))
    print(f"\nsentinel failover (fail_open={fail_open}): limiting resumed {resumed:.1f}s after the master died")
    assert sentinel.master_port() == sentinel.replica.port  # the sentinel promoted the replica
    assert meanwhile and set(meanwhile) == ({200} if fail_open else {503})
    assert [search(client) for _ in range(5)] == [429] * 5  # nothing admitted over the limit once it resumed
    usage = live.live_usage(compile_policy(row))  # the admin's own client follows the promotion too
    assert (usage.allowed, [(s.display, s.count) for s in usage.subjects]) == (3, [(f"ip:{IP}", 3)])
