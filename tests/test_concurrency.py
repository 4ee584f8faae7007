"""In-flight (concurrency) policies: a place per request while it runs, given back when its response
is done, through every door; exact under processes; a reference model with releases."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import partial

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import Client, RequestFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_app import engine, live
from ratelimit_app.engine import giveback
from ratelimit_app.middleware import RateLimitMiddleware
from ratelimit_app.policies import get_index
from ratelimit_app.values import Held
from tests.helpers import check, in_processes, make_policy, policy, subject
from tests.servers import Server, manage, site_env

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.inflight_urls")]

IP = "203.0.113.7"
make = partial(make_policy, name="inflight-per-ip", action="inflight", limit=2, window=60, strategy="concurrency")
T0 = 1_800_000_000_000  # ms


def inflight_policy():
    return next(p for p in get_index().policies if p.action == "inflight")


def in_flight(who: str = IP) -> int:
    """The places the policy holds for `who` now."""
    return engine.decide([check(inflight_policy(), f"ip:{who}")], dry_run=True).decisions[0].count


# --- the engine against a model with releases ---------------------------------------------------


@dataclass
class Places:
    """What a concurrency policy should do: leases held until given back or until they run out."""

    window: int
    held: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)  # who -> lease -> (until, units)

    def count(self, who: str, now: int) -> int:
        return sum(units for until, units in self.held.get(who, {}).values() if until > now)

    def take(self, who: str, lease: str, now: int, limit: int, cost: int) -> bool:
        if self.count(who, now) + cost > limit:
            return False
        self.held.setdefault(who, {})[lease] = (now + self.window, cost)
        return True

    def give_back(self, who: str, lease: str) -> None:
        self.held.get(who, {}).pop(lease, None)


operations = st.lists(
    st.tuples(
        st.sampled_from(["take", "take", "give back"]),
        st.integers(min_value=0, max_value=1500),  # ms since the previous operation
        st.sampled_from(["ip:198.51.100.1", "ip:198.51.100.2"]),
        st.integers(min_value=1, max_value=3),  # the limit in effect
        st.sampled_from([1, 1, 2, 4]),  # the cost (4: above every limit)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations)
def test_places_are_taken_and_given_back_as_the_model_says(redis_client, steps):
    redis_client.flushdb()
    limited = policy(strategy="concurrency", limit=3, window=4)
    model, now, taken = Places(4000), T0, []
    for number, (operation, gap, who, limit, cost) in enumerate(steps):
        now += gap
        if operation == "give back" and taken:
            lease, place = taken.pop(0)
            model.give_back(place.subject.display, lease)
            engine.release([place])
            continue
        lease = f"lease{number}"
        expected = model.take(who, lease, now, limit, cost)
        [decision] = engine.decide([check(limited, who, limit)], now=now / 1000, cost=cost, lease=lease).decisions
        assert (decision.allowed, decision.count) == (expected, model.count(who, now)), (number, who, now - T0)
        if decision.allowed:
            taken.append((lease, Held(limited, subject(who), lease, cost)))
        elif cost <= limit:
            assert 0 < decision.retry_after <= 1  # a second, unless a lease runs out sooner
        else:
            assert decision.retry_after is None


def _hold(compiled, start, results, attempts=10):
    start.wait()
    results.put(sum(engine.decide([check(compiled)], lease=f"{id(start)}-{n}-{time.perf_counter_ns()}").allowed
                    for n in range(attempts)))


def test_eight_processes_hold_exactly_the_limit():
    limited = policy(strategy="concurrency", limit=5, window=60)
    assert sum(in_processes(_hold, (limited,))) == 5
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 5


def test_a_refused_request_takes_no_place_anywhere():
    places = policy(strategy="concurrency", limit=5)
    tight = policy(limit=1)
    assert engine.decide([check(places), check(tight)], lease="a").allowed
    assert not engine.decide([check(places), check(tight)], lease="b").allowed
    assert [d.count for d in engine.decide([check(places), check(tight)], dry_run=True).decisions] == [1, 1]


def test_changing_only_the_window_keeps_the_requests_running():
    """The window of an in-flight policy is its lease: a new length applies to requests to come."""
    row = make_policy(name="one-at-a-time", action="inflight", limit=1, window=60, strategy="concurrency")
    running = engine.decide([check(inflight_policy(), f"ip:{IP}")], lease="running")
    row.window = 120
    row.save()
    after = engine.decide([check(inflight_policy(), f"ip:{IP}")], lease="second")
    assert (running.allowed, after.allowed) == (True, False)


def test_a_lease_given_back_before_its_call_ran_takes_nothing():
    """A worker that stopped waiting for its call gives the lease back; Redis may run the call after."""
    limited = policy(strategy="concurrency", limit=2)
    engine.release([Held(limited, subject(), "gave-up", 1)])
    late = engine.decide([check(limited)], lease="gave-up")
    assert late.allowed  # nobody reads this answer: the request was answered without it
    assert [engine.decide([check(limited)], lease=lease).allowed for lease in ("a", "b", "c")] == [True, True, False]
    engine.release([Held(limited, subject(), "a", 1)])
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 1


def test_a_large_cost_takes_and_gives_back_every_place():
    """Members are added and removed in bounded steps: Lua's unpack() cannot take 10,000 at once."""
    limited = policy(strategy="concurrency", limit=20_000)
    assert engine.decide([check(limited)], cost=6_000, lease="upload").allowed
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 6_000
    engine.release([Held(limited, subject(), "upload", 6_000)])
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 0


def test_a_give_back_waits_for_no_reply():
    """The request is answered: its give-back is written, and no reply is waited for."""
    from redis import Connection

    limited = policy(strategy="concurrency", limit=2)
    assert engine.decide([check(limited)], lease="done").allowed
    read, replies = Connection.read_response, []

    def counting(self, *args, **kwargs):
        replies.append(1)
        return read(self, *args, **kwargs)

    Connection.read_response = counting
    try:
        engine.release([Held(limited, subject(), "done", 1)])
    finally:
        Connection.read_response = read
    assert len(replies) == 0
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 0


def test_a_give_back_is_one_write_that_runs_two_server_commands(redis_client):
    """The EVAL and its ZREM, sent without waiting: the reply is read before the connection's next
    command (here at once, to know that it ran)."""
    from ratelimit_app.engine import decision_client
    from tests.helpers import server_commands_per_call

    limited = policy(strategy="concurrency", limit=100)
    leases = iter(f"lease{n}" for n in range(10))
    for n in range(10):
        assert engine.decide([check(limited)], lease=f"lease{n}").allowed

    def give_back():
        engine.release([Held(limited, subject(), next(leases), 1)])
        kept = decision_client().connection
        assert kept.can_read(timeout=5)  # its reply has come: it ran
        giveback.read_unread(kept)

    def written() -> tuple[int, int]:
        stats = redis_client.info("commandstats")
        return tuple(stats.get(name, {}).get("calls", 0) for name in ("cmdstat_eval", "cmdstat_zrem"))

    # counted by name: a connection's own upkeep (a health-check PING, CLIENT SETINFO on a new one) is
    # not the give-back's work, and a loaded machine makes it happen during the calls
    giveback.owed.forget()  # give-backs an earlier test's threads left owed would ride along with these
    server_commands_per_call(redis_client, give_back, count=10)  # resets the server's counts first
    assert written() == (10, 10)
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 0


# --- the doors give the place back when the request ends ----------------------------------------------


def test_a_place_is_held_while_the_view_runs_and_given_back_after(client):
    make()
    response = client.get("/plain/", REMOTE_ADDR=IP)
    assert response.content == b"1"
    assert response["RateLimit"] == '"inflight-per-ip";r=1;t=60'
    assert in_flight() == 0


def test_a_view_that_raises_gives_its_place_back():
    make()
    client = Client(raise_request_exception=False)
    assert [client.get("/boom/", REMOTE_ADDR=IP).status_code for _ in range(3)] == [500, 500, 500]
    assert in_flight() == 0


def test_a_streamed_response_holds_its_place_until_it_is_closed(client):
    make()
    response = client.get("/stream/", REMOTE_ADDR=IP)
    assert b"".join(response.streaming_content) == b"first 1"  # held while the body was produced
    response.close()
    assert in_flight() == 0


def test_a_streamed_body_gives_its_place_back_when_it_ends_before_it_is_closed():
    make()
    response = RateLimitMiddleware(lambda request: StreamingHttpResponse(iter(["a ", "body"])))(
        RequestFactory().get("/plain/", REMOTE_ADDR=IP))
    assert in_flight() == 1
    assert b"".join(response) == b"a body"  # the server has yet to end the body and close the response
    assert in_flight() == 0


def test_a_streamed_response_replaced_by_a_304_gives_its_place_back(settings):
    settings.MIDDLEWARE = ["django.middleware.http.ConditionalGetMiddleware", *settings.MIDDLEWARE]
    make()
    statuses = [Client().get("/stream/etag/", REMOTE_ADDR=IP, HTTP_IF_NONE_MATCH='"parts"').status_code for _ in range(4)]
    assert statuses == [304] * 4
    assert in_flight() == 0


def test_the_limit_refuses_the_third_request_in_flight_with_retry_after_1():
    make()
    # streamed bodies not read yet: the requests are still running
    middleware = RateLimitMiddleware(lambda request: StreamingHttpResponse(iter(["ok"])))
    responses = [middleware(RequestFactory().get("/plain/", REMOTE_ADDR=IP)) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[2]["Retry-After"] == "1"
    assert in_flight() == 2
    responses[0].close()
    assert in_flight() == 1


@pytest.mark.parametrize("path", ["/decorated/", "/hit/", "/api/", "/decorated/async/"])
def test_every_door_gives_the_place_back(client, path):
    make()
    response = client.get(path, REMOTE_ADDR=IP)
    assert response.status_code == 200 and b"1" in response.content
    assert in_flight() == 0


# /hit/boom/: a route the middleware knows no policy meets, after the first request: the view's own hit()
@pytest.mark.parametrize("path", ["/decorated/boom/", "/api/boom/", "/hit/boom/"])
def test_views_that_raise_behind_the_doors_give_their_places_back(path):
    make()
    client = Client(raise_request_exception=False)
    assert [client.get(path, REMOTE_ADDR=IP).status_code for _ in range(3)] == [500, 500, 500]
    assert in_flight() == 0


def test_without_the_middleware_the_decorator_and_drf_give_places_back(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "ratelimit" not in m]
    make()
    client = Client()
    for path in ["/decorated/", "/api/", "/decorated/async/"]:
        assert client.get(path, REMOTE_ADDR=IP).status_code == 200
        assert in_flight() == 0, path


def test_without_any_door_hit_gives_places_back_as_the_request_ends_and_leaves_its_close_alone(settings):
    """Under WSGI (and ASGI from Django 6.1) request_started and request_finished run in the request's
    context: its closing step runs there, and the request's own close() stays Django's."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "ratelimit" not in m]
    make()
    client = Client()
    for path in ["/hit/", "/hit/async/"]:
        response = client.get(path, REMOTE_ADDR=IP)
        assert response.status_code == 200, path
        assert in_flight() == 0, path
        assert "close" not in response.wsgi_request.__dict__, path


def test_the_live_page_shows_the_requests_in_flight():
    make()
    compiled = inflight_policy()
    engine.decide([check(compiled, f"ip:{IP}")], lease="one")
    engine.decide([check(compiled, f"ip:{IP}")], lease="two")
    [shown] = live.live_usage(compiled).subjects
    assert (shown.display, shown.count) == (f"ip:{IP}", 2)


# --- a real ASGI server: async views, a client that leaves ----------------------------------------------


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _start_slow(port: int) -> socket.socket:
    """A client asking for a slow report, which keeps its connection open."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection.sendall(b"GET /demo/report/?seconds=30 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return connection


def _places_held(redis_client) -> int:
    """The places the site's in-flight policy holds now (its one subject, 127.0.0.1)."""
    return sum(redis_client.zcount(key, 0, "+inf") for key in redis_client.scan_iter(match="*:c"))


def _until(condition, tries: int = 200) -> bool:
    for _ in range(tries):
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_under_uvicorn_a_client_that_leaves_gives_its_place_back(tmp_path, redis_client):
    env = site_env(tmp_path / "site.sqlite3")
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", "from ratelimit_app.models import Policy\n"
           "Policy.objects.create(name='reports', action='report', limit=2, window=60, strategy='concurrency', key='ip')")
    server = Server(env, asgi=True)
    quick = server.url + "/demo/report/?seconds=0"
    try:
        assert [_status(quick), _status(quick)] == [200, 200]
        # given back when the server closes the response, a moment after the client has read it
        assert _until(lambda: _places_held(redis_client) == 0)
        slow = [_start_slow(server.port)]
        assert _until(lambda: _places_held(redis_client) == 1)
        slow.append(_start_slow(server.port))
        assert _until(lambda: _places_held(redis_client) == 2)
        assert _status(quick) == 429
        slow[0].close()  # the client leaves: Django cancels the view, its place goes back
        assert _until(lambda: _places_held(redis_client) == 1)
        assert _status(quick) == 200
        assert _until(lambda: _places_held(redis_client) == 1)
        slow[1].close()
        assert _until(lambda: _places_held(redis_client) == 0)
    finally:
        server.stop()


def test_a_concurrency_policy_declared_beside_a_view(client):
    from ratelimit_app.decorators import ratelimit

    view = ratelimit(rate="2/m", key="ip", strategy="concurrency", name="reports-here")(
        lambda request: StreamingHttpResponse(iter(["ok"])))
    responses = [view(RequestFactory().get("/", REMOTE_ADDR=IP)) for _ in range(3)]  # bodies not read yet
    assert [r.status_code for r in responses] == [200, 200, 429]
    for response in responses:
        response.close()
    assert view(RequestFactory().get("/", REMOTE_ADDR=IP)).status_code == 200


@pytest.mark.urls("project.urls")
def test_the_admin_offers_the_strategy_and_says_what_the_window_means_for_it(admin_client):
    page = admin_client.get("/admin/ratelimit_app/policy/add/").content.decode()
    assert "Concurrency (requests in flight)" in page
    assert "For concurrency: the lease" in page and "For concurrency: requests in progress at once" in page


@pytest.mark.urls("project.urls")
@pytest.mark.parametrize("seconds", ["abc", "nan", "inf"])
def test_the_demo_report_refuses_a_bad_duration_with_a_400(client, seconds):
    response = client.get(f"/demo/report/?seconds={seconds}")
    assert response.status_code == 400 and "seconds must be a number" in response.json()["detail"]


@pytest.mark.urls("project.urls")
def test_the_live_page_of_an_in_flight_policy_says_in_flight(admin_client):
    row = make()
    engine.decide([check(inflight_policy(), f"ip:{IP}")], lease="one")
    page = admin_client.get(f"/admin/ratelimit_app/policy/{row.pk}/live/").content.decode()
    assert "in flight" in page and f"ip:{IP}" in page
