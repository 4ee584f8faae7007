"""Redis outages: fail open (or closed) without hanging requests, and resume by themselves."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from django.core.checks import run_checks
from redis.backoff import NoBackoff
from redis.retry import Retry

from project.devredis import PrivateRedis
from ratelimit_app import engine, events, limiter
from ratelimit_app.engine import RedisUnavailable, clients, keys
from ratelimit_app.engine.tally import tally
from ratelimit_app.models import Policy
from tests.helpers import check, count_round_trips, in_threads, make_policy, policy, stalled, subject

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


@pytest.fixture
def limited(db):
    policy = Policy(name="search-per-ip", action="demo:search", limit=1, window=3600, strategy="fixed_window", key="ip")
    policy.full_clean()
    policy.save()
    return policy


def search(client):
    return client.get("/demo/search/?q=a", REMOTE_ADDR=IP)


def restart(server: PrivateRedis) -> PrivateRedis:
    server.stop()
    return PrivateRedis(port=server.port).start()


def until_limited(client, deadline=30.0) -> list[int]:
    """The statuses answered, in order, until a request is denied again (limiting has resumed); the
    deadline only stops a loop that would never end."""
    seen: list[int] = []
    give_up = time.monotonic() + deadline
    while not seen or seen[-1] != 429:
        assert time.monotonic() < give_up, f"limiting did not resume: {seen[-5:]}"
        seen.append(search(client).status_code)
        time.sleep(0.02)
    return seen


def connections_received(watcher: redis.Redis) -> int:
    """Connections the server has accepted so far (the watcher's own included, once)."""
    return watcher.info("stats")["total_connections_received"]


def test_fail_open_lets_requests_through_and_the_open_circuit_tries_no_connection(client, server, limited, caplog, settings, monkeypatch):
    monkeypatch.setattr(limiter, "outage", events.Outage())  # an outage log of this test's own
    settings.RATELIMIT_DENY_CACHE = False  # else the subject over its limit stays refused from memory
    settings.RATELIMIT_BREAKER_SECONDS = 60  # every request below falls in the circuit's first interval
    assert [search(client).status_code for _ in range(2)] == [200, 429]
    tally.flush()  # no count is left to reach the server later, on a connection of its own
    server.stop()
    failures = engine.breaker.failures
    assert [search(client).status_code for _ in range(50)] == [200] * 50
    assert engine.breaker.failures - failures == 1  # the first request met the outage, the others fail fast
    assert caplog.text.count("Redis unavailable") == 1  # once per interval, not per request

    back = PrivateRedis(port=server.port).start()
    try:
        watcher = redis.Redis(port=back.port)
        before = connections_received(watcher)
        assert [search(client).status_code for _ in range(10)] == [200] * 10
        assert connections_received(watcher) == before  # the open circuit asks nobody, even a server that is back
    finally:
        back.stop()


def test_limiting_resumes_by_itself_once_the_breaker_interval_has_passed(client, server, limited, settings):
    settings.RATELIMIT_DENY_CACHE = False
    settings.RATELIMIT_BREAKER_SECONDS = 0.5
    assert [search(client).status_code for _ in range(2)] == [200, 429]
    server.stop()
    failures = engine.breaker.failures
    assert search(client).status_code == 200  # fails open; the circuit opens
    back = PrivateRedis(port=server.port).start()
    try:
        seen = until_limited(client)
    finally:
        back.stop()
    # let through while the circuit was open; then one probe, counted by the restarted (empty) server,
    # closed the circuit, and the next request was denied
    assert len(seen) >= 2 and seen == [200] * (len(seen) - 1) + [429]
    assert engine.breaker.failures - failures == 1  # nothing but the first request met the outage


def test_a_subject_over_its_limit_stays_refused_while_redis_is_down_across_policy_reloads(
    client, server, limited, settings, outage_forgotten
):
    settings.RATELIMIT_POLICY_RELOAD_SECONDS = 0.2
    assert [search(client).status_code for _ in range(2)] == [200, 429]
    server.stop()
    assert search(client).status_code == 429  # refused from memory: Redis is not needed for it
    time.sleep(0.3)  # the next request reloads the policies (the safety net), Redis still unreachable
    assert [search(client).status_code for _ in range(3)] == [429] * 3  # nothing learned: still over its limit


def test_fail_closed_answers_503_with_retry_after_and_resumes(client, server, limited, settings):
    settings.RATELIMIT_FAIL_OPEN = False
    assert search(client).status_code == 200
    server.stop()
    refused = [search(client) for _ in range(20)]
    assert {r.status_code for r in refused} == {503}
    assert all(r.headers["Retry-After"] == "1" for r in refused)
    back = PrivateRedis(port=server.port).start()
    try:
        seen = until_limited(client)
    finally:
        back.stop()
    # refused while the circuit was open; then the restarted (empty) server counts anew: one allowed, one denied
    assert seen == [503] * (len(seen) - 2) + [200, 429]


def test_a_restart_between_requests_reaches_no_request(client, server, limited, settings):
    settings.RATELIMIT_FAIL_OPEN = False  # any error would show as a 503
    assert search(client).status_code == 200
    back = restart(server)
    try:
        assert [search(client).status_code for _ in range(2)] == [200, 429]  # restarted empty
    finally:
        back.stop()


@pytest.mark.parametrize("functions, flush", [(False, "script_flush"), ("auto", "function_flush")])
def test_script_or_function_flush_mid_run_reaches_no_request(client, server, limited, settings, functions, flush):
    settings.RATELIMIT_FAIL_OPEN = False
    settings.RATELIMIT_REDIS_FUNCTIONS = functions
    assert search(client).status_code == 200
    getattr(engine.client(), flush)()
    assert search(client).status_code == 429


def test_a_port_with_nothing_listening_fails_open_at_once(client, settings, limited):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    settings.RATELIMIT_BREAKER_SECONDS = 60
    failures = engine.breaker.failures
    assert {search(client).status_code for _ in range(30)} == {200}
    assert engine.breaker.failures - failures == 1  # one refused attempt; the open circuit answers the rest


def test_missing_socket_timeouts_are_reported_by_a_system_check(settings):
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}
    assert "ratelimit_app.W002" in [message.id for message in run_checks()]


@pytest.mark.parametrize("cache", [
    {"LOCATION": "redis://127.0.0.1:1/0", "OPTIONS": {"CONNECTION_POOL_KWARGS": {
        "socket_connect_timeout": 0.25, "socket_timeout": 0.25}}},
    {"LOCATION": "redis://127.0.0.1:1/0?socket_connect_timeout=0.25&socket_timeout=0.25"},
], ids=["pool kwargs", "location query"])
def test_timeouts_set_where_redis_py_reads_them_are_not_reported_missing(settings, cache):
    """redis-py takes them from CONNECTION_POOL_KWARGS, or from the LOCATION's query, as well as from OPTIONS."""
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", **cache}}
    assert "ratelimit_app.W002" not in [message.id for message in run_checks()]


def test_a_location_query_without_a_timeout_keeps_the_report(settings):
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:1/0?socket_timeout=0.25"}}
    [warning] = [message for message in run_checks() if message.id == "ratelimit_app.W002"]
    assert "SOCKET_CONNECT_TIMEOUT" in warning.msg and "SOCKET_TIMEOUT" not in warning.msg.replace("SOCKET_CONNECT", "")


def test_a_cache_that_is_not_redis_is_an_error(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    assert "ratelimit_app.E002" in [message.id for message in run_checks()]


# --- a stalled Redis -----------------------------------------------------------------------------


@pytest.fixture
def stall(server):
    """stall(seconds): the server sleeps (DEBUG SLEEP, sent from another connection); returns that thread."""
    def pause(seconds: float) -> threading.Thread:
        return stalled(server.port, seconds)
    return pause


def remaining(response) -> int:
    return int(response.headers["RateLimit"].split(";r=")[1].split(";")[0])


def test_a_stalled_redis_is_asked_once_and_counts_the_request_once(client, server, settings, stall):
    settings.RATELIMIT_POLICY_RECHECK_SECONDS = 60  # only the decision call meets the stall
    settings.RATELIMIT_BREAKER_SECONDS = 0.1
    make_policy(name="search", action="demo:search", limit=100)
    assert remaining(search(client)) == 99  # connected, script loaded
    # longer than one socket timeout (0.25 s), shorter than two: a retry after the timeout would
    # reach the server once it wakes, and the command would run twice
    sleeping = stall(0.45)
    with count_round_trips() as trips:
        started = time.monotonic()
        assert search(client).status_code == 200
        waited = time.monotonic() - started
    sleeping.join()
    time.sleep(0.15)  # the circuit half-opens
    after = search(client)
    print(f"\nrequest during DEBUG SLEEP 0.45 waited {waited:.3f}s (SOCKET_TIMEOUT 0.25), {trips[0]} commands sent")
    assert trips[0] == 1  # sent once: a timeout is not retried
    # never counted twice (96), as a retried timeout would; whether the server still runs the script it
    # read before sleeping, from a connection the client closed meanwhile, is the server's timing (97 or 98)
    assert remaining(after) >= 97


def test_a_configuration_retrying_timeouts_is_reported_by_a_system_check(settings):
    def warned(pool_kwargs, id="ratelimit_app.W003"):
        options = {**settings.CACHES["default"]["OPTIONS"], "CONNECTION_POOL_KWARGS": pool_kwargs}
        settings.CACHES = {"default": {**settings.CACHES["default"], "OPTIONS": options}}
        return id in [message.id for message in run_checks()]

    assert warned({"retry_on_error": [redis.ConnectionError]})  # redis-py adds it to a Retry that retries timeouts
    assert warned({"retry_on_timeout": True})
    assert warned({"retry": Retry(NoBackoff(), 1)})
    assert not warned({"retry": Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))})
    assert not warned({})
    assert warned({"retry_on_error": 5}, id="ratelimit_app.E004")  # not a list: said, never a crash


def test_a_location_query_retrying_timeouts_is_reported_by_a_system_check(settings):
    """redis-py reads the LOCATION's query last: its retry_on_timeout adds timeouts to the recommended retry."""
    recommended = {"retry": Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))}
    options = {**settings.CACHES["default"]["OPTIONS"], "CONNECTION_POOL_KWARGS": recommended}
    location = settings.CACHES["default"]["LOCATION"]
    settings.CACHES = {"default": {**settings.CACHES["default"], "OPTIONS": options,
                                   "LOCATION": f"{location}?retry_on_timeout=true"}}
    assert "ratelimit_app.W003" in [message.id for message in run_checks()]


def test_a_cache_that_never_retries_a_broken_connection_is_reported_by_a_system_check(settings):
    def warned(pool_kwargs):
        options = {**settings.CACHES["default"]["OPTIONS"], "CONNECTION_POOL_KWARGS": pool_kwargs}
        settings.CACHES = {"default": {**settings.CACHES["default"], "OPTIONS": options}}
        return "ratelimit_app.W006" in [message.id for message in run_checks()]

    assert warned({})  # redis-py's default for a pool: no retry at all
    assert warned({"retry": Retry(NoBackoff(), 0)})
    assert not warned({"retry": Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))})


def test_the_recommended_settings_do_not_retry_timeouts(settings):
    assert not clients.retries_timeouts(settings.CACHES["default"]["OPTIONS"]["CONNECTION_POOL_KWARGS"])


# --- the circuit breaker -------------------------------------------------------------------------


def test_when_the_circuit_half_opens_one_call_probes_and_the_others_fail_fast(server, settings, stall):
    settings.RATELIMIT_BREAKER_SECONDS = 0.3
    compiled = policy(limit=100)
    engine.decide([check(compiled)])  # connected, script loaded
    sleeping = stall(3)
    with pytest.raises(RedisUnavailable):
        engine.decide([check(compiled)])  # one timeout opens the circuit
    time.sleep(0.35)  # half-open
    failures = engine.breaker.failures
    _, errors = in_threads(lambda: engine.decide([check(compiled)]), threads=16)
    refused = [error for error in errors if isinstance(error, RedisUnavailable)]
    sleeping.join()
    assert len(refused) == 16
    assert engine.breaker.failures - failures == 1  # only the probe met the hung server


def test_an_error_redis_answers_with_is_logged_counted_apart_and_keeps_the_circuit_closed(redis_client, caplog):
    compiled = policy(limit=5)
    redis_client.rpush(keys.counter_key(compiled, subject().key), "not a counter")
    failures, errors = engine.breaker.failures, engine.breaker.errors
    with pytest.raises(RedisUnavailable):
        engine.decide([check(compiled)])
    assert "WRONGTYPE" in caplog.text
    assert (engine.breaker.failures - failures, engine.breaker.errors - errors) == (0, 1)
    assert engine.decide([check(compiled, "ip:198.51.100.1")]).allowed  # other subjects are still decided


def test_a_read_only_replica_is_an_error_not_an_outage(server, caplog):
    compiled = policy(limit=5)
    own = redis.Redis(port=server.port)
    failures, errors = engine.breaker.failures, engine.breaker.errors
    own.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica now, as after a failover
    try:
        with pytest.raises(RedisUnavailable):
            engine.decide([check(compiled)])
    finally:
        own.execute_command("REPLICAOF", "NO", "ONE")
    assert "READONLY" in caplog.text
    assert (engine.breaker.failures - failures, engine.breaker.errors - errors) == (0, 1)
    assert engine.decide([check(compiled)]).allowed  # promoted again: decided at once, no open circuit


def test_the_outage_log_names_the_real_cause(client, server, limited, caplog):
    server.stop()
    assert search(client).status_code == 200
    assert f"127.0.0.1:{server.port}" in caplog.text and "refused" in caplog.text.lower()


def test_the_outage_counter_counts_requests_not_doors(client, server):
    make_policy(name="everything", action="*", limit=100)  # the middleware decides it
    make_policy(name="login", action="login", limit=100)  # the decorator decides it
    server.stop()
    before = events.outage.requests
    assert [client.post("/demo/login/", REMOTE_ADDR=IP).status_code for _ in range(3)] == [401] * 3
    assert events.outage.requests - before == 3


def test_an_outage_reported_twice_for_one_request_counts_once(rf):
    request, other = rf.get("/"), rf.get("/")
    before = events.outage.requests
    for made in (request, request, other):
        events.outage.record(RedisUnavailable("down"), made)
    assert events.outage.requests - before == 2
