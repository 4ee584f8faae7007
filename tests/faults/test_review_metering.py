"""A hostile review of metered usage and the closing step, on real servers: a worker forked while its parent
owes settled usage never sends it too (counted twice), nor hangs on a lock its parent held; a unit changed
starts fresh counters; settled usage dropped while Redis is away is logged as such; a child forked during
a probe of Redis closes its own circuit."""

from __future__ import annotations

import logging

import pytest
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import closing, engine
from ratelimit_app.engine import giveback
from ratelimit_app.models import Policy
from ratelimit_app.policies import get_index
from ratelimit_app.values import Adjustment
from tests.faults.test_connections import TIMEOUTS, circuit, use_server  # noqa: F401 - a fixture
from tests.faults.test_metering import counted, metered, settled_request
from tests.faults.test_review_giveback import _until
from tests.helpers import check, in_processes, stalled

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
    settled_request(250)
    giveback.owed.forget()
    sleeping = stalled(private.port, 2)
    try:
        with pytest.raises(engine.RedisUnavailable):  # the stall opens the circuit
            engine.decide([check(compiled, "ip:198.51.100.9")])
        closing.request_ended()  # its settle is owed
        assert [type(item) for item in giveback.owed.places] == [Adjustment]
        with giveback.owed._lock:  # as the parent's owed timer holds it while it takes what is owed
            assert in_processes(_child_settles, (compiled,), processes=1, timeout=60) == [True]
    finally:
        sleeping.join()
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
