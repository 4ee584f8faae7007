"""The request path's clients as production Redis set-ups use them: Sentinel and ACL users reach sync
and async decisions alike, and a connection Redis closed (idle timeout, CLIENT KILL) is replaced on
the spot instead of being reported as an outage."""

from __future__ import annotations

import asyncio

import pytest
import redis

from project.devredis import PrivateRedis
from ratelimit_app import engine
from tests.cluster import LocalSentinel, wait_for
from tests.helpers import check, policy
from tests.test_sentinel import sentinel_cache
from tests.tls_proxy import TlsProxy

pytestmark = pytest.mark.django_db
TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}


@pytest.fixture
def no_outage():
    """Asserts, after the test, that no decision found Redis unavailable."""
    before = engine.breaker.failures
    yield
    assert engine.breaker.failures == before


def use_cache(settings, cache: dict) -> None:
    settings.CACHES = {**settings.CACHES, "limits": cache}
    settings.RATELIMIT_CACHE = "limits"


def plain_cache(url: str, **options: object) -> dict:
    """The README's cache: timeouts, and nothing else (no retry option)."""
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url, "OPTIONS": {**TIMEOUTS, **options}}


def sync_answers(compiled, times: int, now: float | None = None) -> list[bool]:
    return [engine.decide([check(compiled)], now=now).allowed for _ in range(times)]


def async_answers(compiled, times: int) -> list[bool]:
    async def decide_all() -> list[bool]:
        return [(await engine.adecide([check(compiled)])).allowed for _ in range(times)]

    return asyncio.run(decide_all())


@pytest.fixture
def sentinel(settings):
    started = LocalSentinel()
    use_cache(settings, sentinel_cache(started))
    yield started
    started.stop()
    engine.breaker.reset()


def test_async_decisions_reach_the_master_through_the_sentinel(sentinel, no_outage):
    assert async_answers(policy(limit=2), 4) == [True, True, False, False]
    assert sync_answers(policy(limit=2, name="other"), 3) == [True, True, False]


@pytest.fixture
def acl_user(private):
    """The server's default user has another password; the cache logs in as a user of its own."""
    admin = redis.Redis(port=private.port)
    admin.acl_setuser("limiter", enabled=True, passwords=["+limiter-secret"], keys=["*"], commands=["+@all"])
    admin.config_set("requirepass", "someone-elses")
    yield private
    admin.close()


def test_async_and_sync_decisions_log_in_as_the_caches_acl_user(settings, acl_user, no_outage):
    use_cache(settings, plain_cache(acl_user.url, USERNAME="limiter", PASSWORD="limiter-secret"))
    compiled = policy(limit=2)
    assert async_answers(compiled, 4) == [True, True, False, False]
    assert sync_answers(compiled, 1) == [False]  # the same counter: the same server, the same user


def test_async_connections_take_the_pool_options_of_the_cache(settings, private):
    use_cache(settings, plain_cache(private.url, CONNECTION_POOL_KWARGS={"client_name": "limiter-async"}))
    compiled = policy(limit=1)

    async def names_while_deciding() -> list[str]:
        assert [(await engine.adecide([check(compiled)])).allowed for _ in range(2)] == [True, False]
        return [client["name"] for client in redis.Redis(port=private.port).client_list()]

    assert "limiter-async" in asyncio.run(names_while_deciding())  # the loop's connection, until the loop ends


def _kept_connections_closed(server: PrivateRedis) -> bool:
    """Whether the server has closed every connection but the one asking."""
    return len(redis.Redis(port=server.port).client_list()) == 1


def test_a_connection_redis_closed_while_idle_is_replaced_not_an_outage(settings, private, no_outage):
    use_cache(settings, plain_cache(private.url))
    compiled = policy(limit=3)
    now = 1_800_000_000.0  # one window whatever the wait below: the counts are the connection's, not the clock's
    assert sync_answers(compiled, 1, now) == [True]  # this thread now keeps a connection
    redis.Redis(port=private.port).config_set("timeout", 1)
    wait_for(lambda: _kept_connections_closed(private), 10, "Redis to close the idle connection")
    assert sync_answers(compiled, 3, now) == [True, True, False]


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_killed_connection_is_replaced_under_either_failure_rule(client, settings, private, fail_open, no_outage):
    from tests.helpers import make_policy

    use_cache(settings, plain_cache(private.url))
    settings.RATELIMIT_FAIL_OPEN = fail_open
    make_policy(name="search-per-ip", action="demo:search", limit=3, window=3600)

    def search() -> int:
        return client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7").status_code

    assert search() == 200
    redis.Redis(port=private.port).client_kill_filter(_type="normal")
    assert [search() for _ in range(3)] == [200, 200, 429]


def test_each_connection_that_replaces_a_killed_one_is_watched_in_its_turn(settings, private, no_outage):
    """The closed-connection check polls the socket the connection has now: killed three times
    between decisions, the connection is replaced each time, every decision counts once, and the
    last one is kept."""
    use_cache(settings, plain_cache(private.url))
    compiled = policy(limit=4)
    now = 1_800_000_000.0
    admin = redis.Redis(port=private.port)
    answers = sync_answers(compiled, 1, now)
    for _ in range(3):
        admin.client_kill_filter(_type="normal", skipme=True)
        wait_for(lambda: len(admin.client_list()) == 1, 10, "Redis to close the kept connection")
        answers += sync_answers(compiled, 1, now)
    assert answers == [True, True, True, True]
    opened = admin.info("stats")["total_connections_received"]
    assert sync_answers(compiled, 5, now) == [False] * 5
    assert admin.info("stats")["total_connections_received"] == opened  # the last one is kept, not replaced again
    admin.close()


# Over the TLS proxy (threads of the test's own process), a connection's handshake can wait longer than
# the README's 0.25 s on a busy machine: these tests are about a closed connection replaced, not timeouts.
TLS_TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5, "CONNECTION_POOL_KWARGS": {"ssl_cert_reqs": "none"}}


@pytest.fixture
def tls(private):
    proxy = TlsProxy(private.port)
    yield proxy
    proxy.close()


def test_a_tls_connection_redis_closed_is_replaced_not_an_outage(settings, private, tls, no_outage):
    """rediss://, as managed services serve Redis: decisions count over TLS, and a connection Redis
    closed between them (CLIENT KILL) is replaced on the spot, here by asking the TLS socket itself
    (a poll cannot see the bytes it holds decrypted)."""
    use_cache(settings, plain_cache(tls.url, **TLS_TIMEOUTS))
    compiled = policy(limit=3)
    now = 1_800_000_000.0
    assert sync_answers(compiled, 1, now) == [True]
    admin = redis.Redis(port=private.port)
    made = tls.accepted  # the kept connection among them
    admin.client_kill_filter(_type="normal", skipme=True)
    wait_for(lambda: tls.closed >= made, 10, "the TLS connections to close")
    assert sync_answers(compiled, 3, now) == [True, True, False]
    assert tls.accepted > made  # replaced, over TLS
    admin.close()


def test_async_decisions_over_tls_replace_a_connection_redis_closed(settings, private, tls, no_outage):
    """The asyncio client over rediss://: a connection Redis closed between two decisions of one event
    loop is replaced, not reported as an outage."""
    use_cache(settings, plain_cache(tls.url, **TLS_TIMEOUTS))
    compiled = policy(limit=3)
    admin = redis.Redis(port=private.port)

    async def decide_kill_decide() -> list[bool]:
        answers = [(await engine.adecide([check(compiled)])).allowed]
        made = tls.accepted
        admin.client_kill_filter(_type="normal", skipme=True)
        for _ in range(200):  # the loop must not block: the proxy's threads close the connections meanwhile
            if tls.closed >= made:
                break
            await asyncio.sleep(0.05)
        # the connection rests: the loop runs and reads its end of file, as between two requests of a
        # server (a close that meets a decision's write is a lost reply, never sent again)
        await asyncio.sleep(0.1)
        answers += [(await engine.adecide([check(compiled)])).allowed for _ in range(3)]
        return answers

    assert asyncio.run(decide_kill_decide()) == [True, True, True, False]
    admin.close()
