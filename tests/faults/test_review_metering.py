"""A hostile review of metered usage and the closing step, on real servers: a worker forked while its parent
owes settled usage never sends it too (counted twice), nor hangs on a lock its parent held; a unit changed
starts fresh counters; settled usage dropped while Redis is away is logged as such; a child forked during
a probe of Redis closes its own circuit; content-bytes counts the bytes sent (gzip, a 304 in the answer's
place), under gunicorn and uvicorn too."""

from __future__ import annotations

import logging
import re
import time
import urllib.request

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient, Client, RequestFactory

import ratelimit_app
from ratelimit_app import closing, engine
from ratelimit_app.engine import giveback
from ratelimit_app.models import Policy
from ratelimit_app.policies import get_index
from tests.faults.test_connections import TIMEOUTS, circuit, use_server  # noqa: F401 - a fixture
from tests.faults.test_metering import counted, metered, settle_owed, settled_request
from tests.faults.test_review_giveback import _until
from tests import servers
from tests.faults.test_review_doors import status
from tests.helpers import check, in_processes, stalled
from tests.servers import migrated_site

pytestmark = pytest.mark.django_db


def _child_settles(compiled, start, results) -> None:
    """A worker forked while its parent owed a settle: once Redis answers, it serves one request of its own."""
    start.wait()
    decided = _until(lambda: _answers(compiled), 20)
    settled_request(30)
    closing.request_ended()
    engine.decide([check(compiled)], dry_run=True)  # carries what waits on its connection
    giveback.carried.send()
    results.put(decided)


def _answers(compiled) -> bool:
    try:
        engine.decide([check(compiled)], dry_run=True)
    except engine.RedisUnavailable:
        return False
    return True


def test_a_worker_forked_while_a_settle_is_owed_never_sends_its_parents_settle(settings, private, circuit):  # noqa: F811
    """gunicorn forks workers from a master that may have served requests (preload_app), and a
    multiprocessing pool forks anytime: the parent's owed settle is the parent's to send, once; and a child
    forked while a thread of the parent held what is owed does not hang at its first settle."""
    use_server(settings, private.url, timeouts=TIMEOUTS)
    compiled = metered()
    # the parent's owed timer holds the lock while it takes what is owed
    with settle_owed(private.port, compiled, 250), giveback.owed._lock:
        assert in_processes(_child_settles, (compiled,), processes=1, timeout=60) == [True]
    assert _until(lambda: not giveback.owed.places)
    assert _until(lambda: counted(private.port, compiled) == 250 + 30)
    engine.decide([check(compiled)], dry_run=True)
    assert counted(private.port, compiled) == 250 + 30


def _admitted(used: int | None = None, cost: int = 10):
    """A request to the metered action, started as a handler starts one; its verdict. With `used` it
    settles that many tokens; its end is the caller's: closing.request_ended()."""
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")
    closing.request_began(environ=request.environ)
    verdict = ratelimit_app.hit(request, "llm", cost=cost)
    if used is not None:
        ratelimit_app.settle(request, tokens=used)
    return verdict


def _flushed() -> None:
    """What waits on this thread's connection, written and answered."""
    giveback.carried.send()
    engine.decide([check(get_index().policies[0])], dry_run=True)


def _to_requests(limit: int) -> None:
    row = Policy.objects.get(name="llm-tokens")
    row.unit, row.limit = "requests", limit
    row.full_clean()
    row.save()
    get_index()  # reloaded: the next request sees the change


@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_window", "token_bucket"])
def test_a_policy_switched_from_tokens_to_requests_counts_requests_afresh(server, strategy):
    """900 tokens are no 900 requests: once the operator counts requests (100 an hour), the caller who
    used 900 tokens has made one request."""
    metered(strategy=strategy, limit=1000, bucket_size=60 if strategy == "sliding_window" else None)
    assert _admitted(900).allowed
    closing.request_ended()
    _flushed()
    _to_requests(100)
    assert _admitted(cost=1).allowed
    closing.request_ended()


def test_a_settle_after_its_policy_counts_requests_moves_no_request_count(server):
    """A stream admitted on a tokens policy ends once the operator made it a requests policy: its 5,000
    tokens do not land on the count of requests (which would refuse the caller for the whole window)."""
    metered(strategy="fixed_window", limit=100_000, bucket_size=None)
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")
    closing.request_began(environ=request.environ)
    assert ratelimit_app.hit(request, "llm", cost=10).allowed
    _to_requests(100)
    ratelimit_app.settle(request, tokens=5000)
    closing.request_ended()
    _flushed()
    verdict = _admitted(cost=1)
    closing.request_ended()
    assert verdict.allowed
    assert verdict.decisions[0].remaining >= 90  # its estimate, 10, counted as requests at most


def test_settled_usage_dropped_while_redis_is_away_is_logged_as_such(settings, private, circuit, caplog, monkeypatch):  # noqa: F811
    """Past its bound, what is owed is dropped with a line for the operator: settled usage dropped is said to
    be settled usage (its requests' estimates stand), not places in flight."""
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    monkeypatch.setattr(giveback.Owed, "LIMIT", 2)
    use_server(settings, private.url, timeouts=TIMEOUTS)
    metered()
    ended = []
    for used in (100, 200, 300):
        settled_request(used)
        ended.append(closing.current.get())
    giveback.owed.forget()
    private.stop()
    for request in ended:
        request.send()
    giveback.carried.send()  # as its timer does: Redis is away, they are owed
    assert "1 settled usages not sent" in caplog.text
    assert "places in flight" not in caplog.text


def _child_decides(compiled, start, results) -> None:
    start.wait()
    results.put(_until(lambda: _answers(compiled), 10))


def test_a_worker_forked_while_its_parent_probed_redis_closes_its_own_circuit(settings, private, circuit):  # noqa: F811
    """A child forked while a thread of its parent probed Redis after an outage (the probe's lock held) would
    find the probe taken forever: its circuit never closed, every request undecided."""
    use_server(settings, private.url, timeouts=TIMEOUTS)
    compiled = metered()
    engine.decide([check(compiled)], dry_run=True)
    sleeping = stalled(private.port, 1)
    try:
        with pytest.raises(engine.RedisUnavailable):  # the stall opens the circuit
            engine.decide([check(compiled, "ip:198.51.100.9")])
    finally:
        sleeping.join()
    with engine.breaker._probe:  # as a thread of the parent holds it while its probe waits for Redis
        assert in_processes(_child_decides, (compiled,), processes=1, timeout=60) == [True]


@pytest.mark.urls("tests.metering_urls")
def test_content_bytes_of_an_answer_replaced_by_a_304_are_not_charged(settings, server):
    """ConditionalGetMiddleware (outside the limiter's) answers a repeat download with a 304 and no body:
    the bytes the view made but the caller never received are not charged."""
    settings.MIDDLEWARE = ["django.middleware.http.ConditionalGetMiddleware", *settings.MIDDLEWARE]
    compiled = metered("download-bytes", action="download", limit=10_000, unit="content-bytes")
    client = Client()
    first = client.get("/download/?size=1234", REMOTE_ADDR="203.0.113.7")
    assert first.status_code == 200
    again = client.get("/download/?size=1234", REMOTE_ADDR="203.0.113.7", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304 and again.content == b""
    _flushed()
    assert engine.decide([check(compiled)], dry_run=True).decisions[0].count == 1234


@pytest.mark.urls("tests.metering_urls")
def test_content_bytes_of_a_compressed_answer_are_the_bytes_sent(settings, server):
    """GZipMiddleware (outside the limiter's) compresses the answer: the caller is charged what was sent."""
    settings.MIDDLEWARE = ["django.middleware.gzip.GZipMiddleware", *settings.MIDDLEWARE]
    compiled = metered("download-bytes", action="download", limit=100_000, unit="content-bytes")
    response = Client().get("/download/?size=5000", REMOTE_ADDR="203.0.113.7", HTTP_ACCEPT_ENCODING="gzip")
    assert response["Content-Encoding"] == "gzip" and len(response.content) < 1000
    _flushed()
    assert engine.decide([check(compiled)], dry_run=True).decisions[0].count == len(response.content)


@pytest.mark.urls("tests.metering_urls")
@pytest.mark.django_db(transaction=True)  # its rows are written from sync_to_async's thread: flushed after it
async def test_content_bytes_of_an_answer_served_by_the_asgi_handler(settings, server):
    compiled = await sync_to_async(metered)("download-bytes", action="download", limit=10_000, unit="content-bytes")
    response = await AsyncClient().get("/download/?size=1234")  # from 127.0.0.1, the scope's client
    assert response.status_code == 200
    await sync_to_async(_flushed)()
    assert _until(lambda: engine.decide([check(compiled, "ip:127.0.0.1")], dry_run=True).decisions[0].count == 1234)


BYTES_POLICY = """
from ratelimit_app.models import Policy
Policy.objects.create(name="download-bytes", action="download", limit=100000, window=3600, strategy="sliding_window",
                      bucket_size=60, key="ip", unit="content-bytes")
"""


@pytest.fixture(scope="module")
def bytes_site(tmp_path_factory):
    return migrated_site(tmp_path_factory.mktemp("review_metering"), "tests.faults.review_metering_settings",
                         BYTES_POLICY)


def _remaining(headers: dict) -> int:
    return int(re.search(r'"download-bytes";r=(\d+)', headers["RateLimit"]).group(1))


@pytest.mark.slow
@pytest.mark.parametrize("kind", [{}, {"asgi": True}], ids=["gunicorn", "uvicorn"])
def test_content_bytes_on_real_servers_are_the_bytes_sent(bytes_site, redis_client, kind):
    """A download compressed by gzip, then a 304 in its place: the next request's header says only the
    compressed bytes and the requests' own estimates were counted."""
    redis_client.flushdb()
    with servers.serving(bytes_site, "tests.faults.review_metering_settings", **kind) as server:
        url = server.url + "/download/?size=5000"
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=20) as answer:
            sent, etag = len(answer.read()), answer.headers["ETag"]
        assert sent < 1000  # compressed
        assert status(url, **{"Accept-Encoding": "gzip", "If-None-Match": etag})[0] == 304
        # settled usage is carried by the worker's next write, or sent within a second by its timer; each
        # request's header counts its own estimate (1) too
        assert _until(lambda: _remaining(status(server.url + "/download/?size=0")[1]) == 100_000 - sent - 1)
        # and it stays there: each empty download settles to 0 (a count that drifts by 1 a request would
        # meet the figure above once, polled: nothing settled)
        for _ in range(2):
            time.sleep(1.5)  # the last one's settle, sent within a second by its timer
            assert _remaining(status(server.url + "/download/?size=0")[1]) == 100_000 - sent - 1
