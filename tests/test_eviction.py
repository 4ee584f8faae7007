"""A Redis that evicts keys once full (maxmemory with an eviction policy) silently drops the counters: a
subject starts again from zero. `check --deploy` and `ratelimit status` say so (W010), and never wait on
a Redis that does not answer."""

from __future__ import annotations

from io import StringIO

import pytest
import redis
from django.core.cache import caches
from django.core.checks import run_checks
from django.core.management import call_command

from project.devredis import PrivateRedis
from ratelimit_app import engine
from ratelimit_app.engine import keys
from tests.helpers import check, make_policy, policy, stalled

pytestmark = pytest.mark.django_db
LIMIT = 10
PAGE = "x" * 100_000  # one cached page of the site


def serving(settings, *options: str, location: str | None = None) -> PrivateRedis:
    """A private Redis started with `options`, holding the limiter's counters (db 0) and the site's cache
    (db 1: a cache alias of its own, the memory of the same server)."""
    server = PrivateRedis(options=options).start()
    default = settings.CACHES["default"]
    settings.CACHES = {
        **settings.CACHES,
        "own": {**default, "LOCATION": location or server.url},
        "site": {**default, "LOCATION": f"redis://127.0.0.1:{server.port}/1"},
    }
    settings.RATELIMIT_CACHE = "own"
    return server


@pytest.fixture
def started(settings):
    servers = []
    yield lambda *options, location=None: servers.append(serving(settings, *options, location=location)) or servers[-1]
    for server in servers:
        server.stop()


def eviction_warnings(deploy: bool = True) -> list:
    return [message for message in run_checks(include_deployment_checks=deploy) if message.id == "ratelimit_app.W010"]


def fill_site_cache_until_gone(server: PrivateRedis, key: str) -> int:
    """Write the site's pages (8 MB of maxmemory holds about 80) until `key` is gone; how many were written."""
    counters = redis.Redis(port=server.port)
    for written in range(1, 1001):  # 100 MB: only stops a loop that would never end
        caches["site"].set(f"page:{written}", PAGE)
        if written % 20 == 0 and not counters.exists(key):
            return written
    return 0


@pytest.mark.parametrize("eviction_policy", ["allkeys-lru", "volatile-lru"])
def test_a_server_that_evicts_admits_a_subject_past_its_limit_and_check_deploy_says_so(started, eviction_policy):
    server = started("--maxmemory", "8mb", "--maxmemory-policy", eviction_policy)
    limited = policy(limit=LIMIT, window=3600)
    admitted = sum(engine.decide([check(limited)]).allowed for _ in range(LIMIT))
    assert fill_site_cache_until_gone(server, keys.counter_key(limited, check(limited).subject.key))
    admitted += sum(engine.decide([check(limited)]).allowed for _ in range(LIMIT + 1))
    assert admitted == 2 * LIMIT  # 20 admitted against 10 an hour, and nothing said at the time
    [warning] = eviction_warnings()
    assert eviction_policy in warning.msg and "maxmemory 8 MB" in warning.msg
    which = "keys with an expiry" if eviction_policy.startswith("volatile-") else "any key"
    assert which in warning.msg


def test_check_deploy_shows_the_warning_and_plain_check_does_not_ask_redis(started, capsys):
    started("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lfu")
    assert eviction_warnings(deploy=False) == []  # check, migrate and runserver never wait on Redis
    call_command("check", deploy=True)
    assert "ratelimit_app.W010" in capsys.readouterr().err


@pytest.mark.parametrize("options", [
    ("--maxmemory", "8mb", "--maxmemory-policy", "noeviction"),
    ("--maxmemory-policy", "allkeys-lru"),  # no maxmemory: nothing is ever evicted
], ids=["noeviction", "no-maxmemory"])
def test_a_server_that_never_evicts_is_not_reported(started, options):
    started(*options)
    assert eviction_warnings() == []


def test_the_policy_is_read_from_info_when_config_is_refused(started, settings):
    """A managed Redis or an ACL user without CONFIG: INFO's memory section tells the same."""
    server = started("--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl")
    redis.Redis(port=server.port).acl_setuser("limiter", enabled=True, passwords=["+secret"], keys=["*"],
                                              channels=["*"], commands=["+@all", "-config"])
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["own"],
                                                  "LOCATION": f"redis://limiter:secret@127.0.0.1:{server.port}/0"}}
    with pytest.raises(redis.ResponseError):  # the user may not read CONFIG
        redis.Redis(port=server.port, username="limiter", password="secret").config_get("maxmemory*")
    [warning] = eviction_warnings()
    assert "volatile-ttl" in warning.msg


def test_a_server_that_refuses_config_and_info_is_skipped_without_error(started, settings):
    server = started("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
    redis.Redis(port=server.port).acl_setuser("limiter", enabled=True, passwords=["+secret"], keys=["*"],
                                              channels=["*"], commands=["+@all", "-config", "-info"])
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["own"],
                                                  "LOCATION": f"redis://limiter:secret@127.0.0.1:{server.port}/0"}}
    assert eviction_warnings() == []


def test_an_unreachable_redis_is_skipped_without_error(started):
    server = started("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
    server.stop()
    assert eviction_warnings() == []
    call_command("check", deploy=True, stdout=StringIO(), stderr=StringIO())  # no error, no traceback


def test_a_redis_that_does_not_answer_is_skipped_after_the_admin_timeout(started, settings):
    server = started("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
    settings.RATELIMIT_ADMIN_TIMEOUT = 0.2
    sleeping = stalled(server.port, 2)
    try:
        assert eviction_warnings() == []
    finally:
        sleeping.join()
    assert len(eviction_warnings()) == 1  # awake again: asked anew


def test_ratelimit_status_shows_the_warning(started):
    started("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-random")
    make_policy(name="search-per-ip", action="demo:search", limit=3, window=60, key="ip")
    out, err = StringIO(), StringIO()
    call_command("ratelimit", "status", stdout=out, stderr=err)
    assert "search-per-ip" in out.getvalue()
    assert "allkeys-random" in err.getvalue() and "ratelimit_app.W010" in err.getvalue()


def test_on_a_cluster_each_master_is_asked_and_the_one_that_evicts_is_named(settings):
    from tests.cluster import LocalCluster
    from tests.test_cluster import use

    cluster = LocalCluster(masters=2, replicas=False)
    try:
        use(cluster, settings)
        evicting = cluster.masters[1]
        evicting.client.config_set("maxmemory", "8mb")
        evicting.client.config_set("maxmemory-policy", "allkeys-lru")
        [warning] = eviction_warnings()
        assert f"127.0.0.1:{evicting.port}" in warning.msg and "allkeys-lru" in warning.msg
    finally:
        cluster.stop()


def test_through_sentinel_the_master_is_asked_and_named_by_its_service(settings):
    from tests.cluster import LocalSentinel
    from tests.test_sentinel import sentinel_cache

    started = LocalSentinel()
    try:
        settings.CACHES = {**settings.CACHES, "sentinel": sentinel_cache(started)}
        settings.RATELIMIT_CACHE = "sentinel"
        started.master.client.config_set("maxmemory", "8mb")
        started.master.client.config_set("maxmemory-policy", "volatile-lfu")
        [warning] = eviction_warnings()
        assert f"{started.service} (Sentinel's master)" in warning.msg and "volatile-lfu" in warning.msg
    finally:
        started.stop()


def fill_until_refused(server: PrivateRedis) -> None:
    """Write the site's small keys until Redis refuses even those (OOM): the server is full."""
    site = redis.Redis(port=server.port, db=1)
    for batch in range(1000):  # 10 M keys: only stops a loop that would never end
        pipe = site.pipeline(transaction=False)
        for i in range(10_000):
            pipe.set(f"k:{batch}:{i}", "y" * 40)
        if any(isinstance(reply, redis.exceptions.OutOfMemoryError) for reply in pipe.execute(raise_on_error=False)):
            return
    raise AssertionError("the server never filled")


def test_a_full_server_that_never_evicts_fails_the_limiter_loudly_never_past_its_limit(started, caplog):
    """What the deployment guide says of noeviction on a shared server: once full, the limiter's calls are
    refused with OOM (answered by RATELIMIT_FAIL_OPEN, logged), and no counter starts again from zero."""
    server = started("--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
    limited = policy(limit=LIMIT, window=3600)
    assert sum(engine.decide([check(limited)]).allowed for _ in range(LIMIT)) == LIMIT
    fill_until_refused(server)
    for who in ("ip:203.0.113.7", "ip:198.51.100.1"):  # at its limit, and new
        with pytest.raises(engine.RedisUnavailable, match="OOM"):
            engine.decide([check(limited, who)])
    assert "OOM" in caplog.text
    assert redis.Redis(port=server.port).get(keys.counter_key(limited, check(limited).subject.key))  # kept
