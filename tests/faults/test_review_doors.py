"""The doors (middleware, @ratelimit, PolicyThrottle) attacked on real servers: a decorator under the
middleware, nested decorators, computed costs past a strategy's bound, streamed bodies abandoned, views
failing after the decision, async views cancelled, HEAD, shadow mode, lowered limits, outages. Once
every request ended, no place is held; every answer says what the user must know."""

from __future__ import annotations

import json
import socket

import pytest

import urllib.error
import urllib.request

from tests.faults.test_inflight import places_held, until
from tests import servers
from tests.servers import migrated_site

SETTINGS = "tests.faults.review_doors_settings"
POLICIES = """
from ratelimit_app.models import Policy
for name, limit, strategy, mode in [
    ("both", 1, "concurrency", "enforce"), ("outer", 1, "concurrency", "enforce"),
    ("inner", 1, "concurrency", "enforce"), ("costly", 20000, "concurrency", "enforce"),
    ("stream", 1, "concurrency", "enforce"), ("raise", 1, "concurrency", "enforce"),
    ("asleep", 2, "concurrency", "enforce"), ("priced", 20000, "concurrency", "enforce"),
    ("plain", 1, "concurrency", "shadow"), ("hitter", 1, "concurrency", "enforce"),
    ("drf1", 1, "concurrency", "enforce"), ("logged", 50000, "sliding_log", "enforce"),
]:
    Policy.objects.create(name=name, action=name, limit=limit, window=60, strategy=strategy, key="ip", mode=mode)
"""


@pytest.fixture(scope="module")
def site_database(tmp_path_factory):
    return migrated_site(tmp_path_factory.mktemp("review_doors"), SETTINGS, POLICIES)


def serving(database, **options):
    return servers.serving(database, SETTINGS, **options)


def leave_mid_body(port: int, path: str, method: str = "GET", read: int = 70000) -> None:
    """A client that reads the start of a response, then leaves."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    got = b""
    while len(got) < read:
        chunk = connection.recv(65536)
        if not chunk:
            break
        got += chunk
    connection.close()


def status(url: str, method: str = "GET", **headers: str) -> tuple[int, dict]:
    """The status and headers of a request whose whole answer was read."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers, method=method), timeout=20) as answer:
            answer.read()
            return answer.status, dict(answer.headers)
    except urllib.error.HTTPError as error:
        error.read()
        return error.code, dict(error.headers)


SERVERS = [pytest.param({"workers": 2}, id="gunicorn"), pytest.param({"asgi": True}, id="uvicorn")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVERS)
def test_head_requests_to_a_streamed_view_are_never_refused_by_their_own_finished_requests(site_database, redis_client,
                                                                                           kind):
    """In-flight limit 1: a HEAD's answer is whole with its headers. Its place went back only once the
    server had read the streamed body it drops, after the client had its answer (the next HEAD: 429);
    the body is not produced at all, which would be work done with no place held."""
    with serving(site_database, **kind) as server:
        for path in ["/stream/", "/astream/", "/drf-stream/"]:
            assert [status(f"{server.url}{path}?chunks=3", method="HEAD")[0] for _ in range(5)] == [200] * 5, path
        assert until(lambda: places_held(redis_client) == 0), places_held(redis_client)
        assert int(redis_client.get("review:chunks") or 0) == 0
        assert status(server.url + "/stream/?chunks=3")[0] == 200  # a GET's body is made and sent
        assert int(redis_client.get("review:chunks") or 0) == 3


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVERS)
def test_places_taken_by_hit_without_the_middleware_go_back_when_the_request_ends(site_database, redis_client, kind):
    """hit() and ahit() in views of a site without the middleware (in-flight limit 1): the places go back
    once each request ended (Django closes it), not its lease (60 s) later. Under ASGI, Django 5.2 and 6.0 send
    request_started to sync receivers in a task of their own, whose context the request never sees."""
    with serving(site_database, FAULTS_WITHOUT_MIDDLEWARE="1", **kind) as server:
        for path in ["/hit/", "/ahit/"]:
            assert status(server.url + path)[0] == 200
            assert until(lambda: places_held(redis_client) == 0, 5), f"{path}: {places_held(redis_client)} held"


@pytest.mark.slow
def test_check_says_what_hit_will_do_with_a_cost_above_the_strategys_bound(site_database, redis_client):
    """A sliding log of 50,000 takes at most 10,000 units at once: check() said a request of 20,000 fit,
    and hit() refused it the next moment, every time."""
    with serving(site_database) as server:
        answers = {}
        for cost in (10_000, 20_000):
            with urllib.request.urlopen(f"{server.url}/look-then-hit/?n={cost}", timeout=20) as answer:
                answers[cost] = json.loads(answer.read())
    assert answers == {10_000: {"looked": True, "hit": True}, 20_000: {"looked": False, "hit": False}}
