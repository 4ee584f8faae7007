"""Places taken by hit()/ahit() where no door gives them back (a site without RateLimitMiddleware) go
back at the first of request_finished and Django's close of the request, on real servers: a client
leaving while the view runs, a streamed body that fails, a hit() made while a body streams."""

from __future__ import annotations

import http.client
import socket
import urllib.request

import django
import pytest

from tests import servers
from tests.faults.test_inflight import places_held, until
from tests.faults.test_review_doors import status
from tests.servers import migrated_site

SETTINGS = "tests.faults.review_closing_settings"
POLICIES = """
from ratelimit_app.models import Policy
Policy.objects.create(name="held", action="held", limit=1, window=60, strategy="concurrency", key="ip", mode="enforce")
"""


@pytest.fixture(scope="module")
def site_database(tmp_path_factory):
    return migrated_site(tmp_path_factory.mktemp("review_closing"), SETTINGS, POLICIES)


def serving_without_middleware(database, **options):
    return servers.serving(database, SETTINGS, FAULTS_WITHOUT_MIDDLEWARE="1", **options)


def leave_while_the_view_runs(port: int, path: str, redis_client) -> None:
    """A client that sends its request, waits until the view took its place, then goes away."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert until(lambda: places_held(redis_client) == 1, 10), "the view never took its place"
    finally:
        connection.close()


# seconds a place may take to go back once its request ended (it takes milliseconds): the expected
# failures below wait this long each
GIVEN_BACK = 4

CANCELLED_BEFORE_DJANGO_61 = (
    "Under ASGI, Django 5.2 and 6.0 cancel a request whose client left and only send request_finished, never "
    "closing the request; its receiver runs in a task whose context never saw request_started's (Django 6.1 runs "
    "both in the request's): the place waits for its lease."
)
FAILED_STREAM = (
    "Under ASGI, Django lets the error of a streamed body out of its handler without closing the response or "
    "sending request_finished: nothing tells a site without the middleware that the request ended, and the "
    "place waits for its lease (docs/howto/in-flight.md)."
)


@pytest.mark.slow
@pytest.mark.xfail(django.VERSION < (6, 1), strict=True, reason=CANCELLED_BEFORE_DJANGO_61)
@pytest.mark.parametrize("path", ["/ahit-sleep/?seconds=1", "/hit-sleep/?seconds=1"], ids=["async-ahit", "sync-hit"])
def test_a_place_taken_by_hit_goes_back_when_the_client_leaves_an_asgi_view(site_database, redis_client, path):
    """Uvicorn, no middleware, in-flight limit 1: the view takes its place, then its client goes away
    before the answer. Django cancels the request and never closes it: request_finished gives the place
    back, or the client's next request is refused (429) for the lease's 60 s."""
    with serving_without_middleware(site_database, asgi=True) as server:
        leave_while_the_view_runs(server.port, path, redis_client)
        given_back = until(lambda: places_held(redis_client) == 0, GIVEN_BACK)
        assert given_back, f"{places_held(redis_client)} place still held"
        assert status(server.url + "/hit/")[0] == 200


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=FAILED_STREAM)
@pytest.mark.parametrize("path", ["/hit-stream-fails/", "/ahit-astream-fails/"],
                         ids=["sync-iterator", "async-iterator"])
def test_a_place_taken_by_hit_goes_back_when_a_streamed_body_fails_under_asgi(site_database, redis_client, path):
    """Uvicorn, no middleware, in-flight limit 1: the view hit() then streams a body that raises after
    its first chunk (gunicorn closes the response: the place goes back there)."""
    with serving_without_middleware(site_database, asgi=True) as server:
        with pytest.raises(http.client.IncompleteRead):
            status(server.url + path)
        given_back = until(lambda: places_held(redis_client) == 0, GIVEN_BACK)
        assert given_back, f"{places_held(redis_client)} place still held"
        assert status(server.url + "/hit/")[0] == 200


@pytest.mark.slow
def test_a_place_taken_by_hit_in_a_streamed_body_goes_back_under_wsgi_as_it_did_before(site_database, redis_client):
    """Gunicorn, no middleware, in-flight limit 1: hit() while the streamed body is produced, after Django
    listed what it closes with the response: request_finished gives the place back once the body was
    sent, or the client's next request is refused in its body."""
    with serving_without_middleware(site_database, workers=1) as server:
        bodies = []
        for _ in range(2):
            with urllib.request.urlopen(server.url + "/body-hits/", timeout=20) as answer:
                bodies.append(answer.read())
        assert bodies == [b"acounted", b"acounted"]
        assert until(lambda: places_held(redis_client) == 0, 10), f"{places_held(redis_client)} place still held"
