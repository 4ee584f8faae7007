"""In-flight (concurrency) places under faults, on real servers: whatever answer the server finally
sends (a 304 in place of the view's, a 500 from a middleware, a failure), a call that a busy Redis
left unanswered, a client that leaves while its call waits, a refusal across cluster shards: once
every request has ended, no place is held, and no request is refused by a finished one."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import giveback
from ratelimit_app.values import Held
from tests.helpers import check, in_processes, policy, subject
from tests.servers import Server, migrated_site, site_env
from tests.test_cluster import cluster, shared_cluster, who_in_other_shards  # noqa: F401 (fixtures)

SETTINGS = "tests.faults.inflight_settings"
POLICIES = """
from ratelimit_app.models import Policy
for name, limit, key in [("etag", 2, "ip"), ("fails", 1, "ip"), ("raise-out", 2, "ip"), ("slow", 3, "global")]:
    Policy.objects.create(name=name, action=name, limit=limit, window=60, strategy="concurrency", key=key)
"""
# a Lua busy loop of ARGV[1] microseconds: other clients wait (it is shorter than Redis' busy-reply threshold)
BUSY = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > tonumber(ARGV[1])
return 0
"""


@pytest.fixture(scope="module")
def site_database(tmp_path_factory):
    return migrated_site(tmp_path_factory.mktemp("inflight"), SETTINGS, POLICIES)


def site(database, **extra: str) -> dict[str, str]:
    return site_env(database, DJANGO_SETTINGS_MODULE=SETTINGS, **extra)


def status(url: str, **headers: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


def places_held(redis_client) -> int:
    """Places the site's in-flight policies hold now (marks of given-back leases score below zero)."""
    return sum(redis_client.zcount(key, 0, "+inf") for key in redis_client.scan_iter(match="rl:*:c*"))


def until(condition, seconds: float = 15) -> bool:
    """Whether `condition` holds within `seconds` (a bound on the wait, never a figure asserted)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def busy_redis(seconds: float):
    """Redis runs a Lua busy loop for `seconds` (longer than the site's socket timeout) meanwhile;
    returns when the loop is over."""
    url = os.environ["REDIS_URL"]
    looping = threading.Thread(target=redis.Redis.from_url(url).eval, args=(BUSY, 0, int(seconds * 1e6)))
    looping.start()
    probe = redis.Redis.from_url(url, socket_timeout=0.05)
    try:
        assert until(lambda: _times_out(probe), 5), "Redis never got busy"
        yield
    finally:
        looping.join(timeout=30)


def _times_out(probe: redis.Redis) -> bool:
    try:
        probe.ping()
    except redis.TimeoutError:
        return True
    return False


# --- the answer the server sends is not the one the doors returned ------------------------------------


@pytest.mark.slow
def test_304s_from_conditional_get_middleware_give_the_places_back(site_database, redis_client):
    server = Server(site(site_database))
    try:
        first, headers = status(server.url + "/page/")
        again = [status(server.url + "/page/", **{"If-None-Match": headers["ETag"]})[0] for _ in range(6)]
        assert [first] + again == [200] + [304] * 6
        assert until(lambda: places_held(redis_client) == 0), places_held(redis_client)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_middleware_failing_on_the_way_out_of_a_decorated_view_leaves_no_place_held(site_database, redis_client):
    server = Server(site(site_database))
    try:
        assert [status(server.url + "/raise-out/")[0] for _ in range(4)] == [500] * 4
        assert until(lambda: places_held(redis_client) == 0), places_held(redis_client)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_sequential_client_is_never_refused_by_its_own_finished_request(site_database):
    """In-flight limit 1 and a view that fails, on a server slow to close what it sent: each request
    is answered before the next is sent."""
    server = Server(site(site_database, FAULTS_WSGI_APPLICATION="tests.faults.slow_wsgi.application"))
    try:
        assert [status(server.url + "/fails/")[0] for _ in range(50)] == [500] * 50
    finally:
        server.stop()


# --- a call left unanswered ---------------------------------------------------------------------------


@pytest.mark.slow
def test_calls_a_busy_redis_left_unanswered_hold_no_place_once_it_answers(site_database, redis_client):
    """A global limit of 3: the requests during the stall pass (fail open); their calls, run by Redis
    after the stall, take nothing that stays."""
    server = Server(site(site_database))
    try:
        statuses = []
        with busy_redis(1.5):
            clients = [threading.Thread(target=lambda: statuses.append(status(server.url + "/slow/")[0]))
                       for _ in range(8)]
            for client in clients:
                client.start()
            for client in clients:
                client.join()
        assert statuses == [200] * 8
        assert until(lambda: places_held(redis_client) == 0), places_held(redis_client)
        assert [status(server.url + "/slow/")[0] for _ in range(3)] == [200] * 3
    finally:
        server.stop()


@pytest.mark.slow
def test_clients_leaving_under_uvicorn_while_their_calls_wait_hold_no_place(site_database, redis_client):
    server = Server(site(site_database, FAULTS_SOCKET_TIMEOUT="10"), asgi=True)
    try:
        with busy_redis(2):
            leaving = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(4)]
            for connection in leaving:
                connection.sendall(b"GET /slow/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            time.sleep(0.3)  # the site has read them and waits for Redis
            for connection in leaving:
                connection.close()
        assert until(lambda: places_held(redis_client) == 0), places_held(redis_client)
        assert [status(server.url + "/slow/?seconds=0")[0] for _ in range(3)] == [200] * 3
    finally:
        server.stop()


# --- across cluster shards ----------------------------------------------------------------------------


def _take_and_give_back(checks, start, results, attempts=40):
    start.wait()
    admitted = 0
    for n in range(attempts):
        lease = f"{os.getpid()}-{n}"
        verdict = engine.decide(checks, lease=lease)
        if verdict.allowed:
            admitted += 1
            engine.release([Held(c.policy, c.subject, lease, 1) for c in checks])
    until(lambda: not giveback.owed.places)  # a worker stays up: what a loaded node left owed is sent
    results.put(admitted)


@pytest.mark.slow
def test_requests_across_cluster_shards_hold_no_place_once_they_ended(cluster):  # noqa: F811
    """Two in-flight policies of one place each, their subjects in two shards, 8 processes: a shard
    that filled between the look and the count refuses, and the other shard's place goes back."""
    first, second = who_in_other_shards(2)
    checks = [check(policy(strategy="concurrency", limit=1, window=300), first),
              check(policy(strategy="concurrency", limit=1, window=300), second)]
    assert sum(in_processes(_take_and_give_back, (checks,))) >= 1

    def held() -> list[int]:
        return [engine.decide([c], dry_run=True).decisions[0].count for c in checks]

    assert until(lambda: held() == [0, 0]), held()
