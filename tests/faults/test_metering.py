"""Settled usage under faults, on real servers: a settle that cannot reach Redis (the server stalled, the
circuit open) is owed and sent once it answers, exactly once; one whose connection Redis closed before
it answered is never sent twice; on a cluster each settle reaches its counter's node."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import pytest
import redis
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import closing, engine
from ratelimit_app.engine import giveback
from ratelimit_app.policies import get_index
from ratelimit_app.values import Adjustment
from tests.faults.test_connections import TIMEOUTS, circuit, use_server  # noqa: F401 - a fixture
from tests.faults.test_review_giveback import _until
from tests.helpers import check, make_policy, stalled

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


def metered(name: str = "llm-tokens", **fields):
    values = {"name": name, "action": "llm", "limit": 100_000, "window": 3600, "strategy": "sliding_window",
              "bucket_size": 60, "unit": "tokens"}
    make_policy(**{**values, **fields})
    return next(p for p in get_index().policies if p.name == name)


def counted(port: int, compiled) -> int:
    """The tokens the counter holds, read on a connection of the test's own (the app's may be stalled)."""
    admin = redis.Redis(port=port)
    try:
        key = engine.counter_key(compiled, check(compiled, f"ip:{IP}").subject.key)
        return int(admin.hget(key, "t") or 0)
    finally:
        admin.close()


def settled_request(used: int) -> None:
    """A request admitted on an estimate of 10 tokens that settles `used`, started as a handler starts one;
    its end (request_finished) is the caller's: closing.request_ended()."""
    request = RequestFactory().get("/", REMOTE_ADDR=IP)
    closing.request_began(environ=request.environ)
    assert ratelimit_app.hit(request, "llm", cost=10).allowed
    ratelimit_app.settle(request, tokens=used)


@contextlib.contextmanager
def settle_owed(port: int, compiled, used: int) -> Iterator[None]:
    """A request that settles `used` ends while the server on `port` stalls (2 s) and the circuit is open:
    its settle is owed while the block runs."""
    settled_request(used)
    giveback.owed.forget()
    sleeping = stalled(port, 2)
    try:
        with pytest.raises(engine.RedisUnavailable):  # the stall opens the circuit
            engine.decide([check(compiled, "ip:198.51.100.9")])
        closing.request_ended()  # the request ends: its settle cannot be sent now
        assert [type(item) for item in giveback.owed.places] == [Adjustment]
        yield
    finally:
        sleeping.join()


def test_a_settle_while_the_circuit_is_open_is_owed_and_sent_once_when_redis_answers(
    settings, private, circuit,  # noqa: F811
):
    use_server(settings, private.url, timeouts=TIMEOUTS)
    compiled = metered()
    with settle_owed(private.port, compiled, 250):
        pass
    assert _until(lambda: counted(private.port, compiled) == 250)  # sent by the owed timer once Redis answers
    assert _until(lambda: not giveback.owed.places)
    for _ in range(5):  # later give-backs and decisions send nothing of it again
        settled_request(10)
        closing.request_ended()
        engine.decide([check(compiled)], dry_run=True)
    assert counted(private.port, compiled) == 250 + 5 * 10


def test_a_settle_whose_connection_redis_closed_unanswered_is_not_sent_again(settings, private, caplog):
    """Its reply lost, a settle may have run: the places written with it are given back again (twice is
    harmless), the settle is not (its request's estimate stands), so that no usage ever counts twice."""
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    giveback.unsure_said.reset()  # said once a minute: an earlier test's line would hold this one back
    use_server(settings, private.url, timeouts=TIMEOUTS)
    make_policy(name="places", action="llm", limit=100, window=600, strategy="concurrency")
    compiled = metered()
    engine.decide([check(compiled)], dry_run=True)  # connected, the scripts loaded
    settled_request(300)  # also holds a place: its end writes now, on the kept connection
    admin = redis.Redis(port=private.port)
    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # every EVAL held unrun
    closing.request_ended()
    assert _until(lambda: any(c["cmd"] == "eval" for c in admin.client_list(_type="normal")), 2)
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # closed with it unanswered
    admin.execute_command("CLIENT", "UNPAUSE")
    admin.close()
    engine.decide([check(compiled)], dry_run=True)  # finds its reply lost
    assert "not sent again, so that none counts twice" in caplog.text
    assert _until(lambda: not giveback.owed.places)
    assert counted(private.port, compiled) == 10


def test_settles_of_many_threads_each_reach_the_counter_once(settings, private):
    use_server(settings, private.url, timeouts=TIMEOUTS)
    compiled = metered()
    totals = []

    def requests(seed: int) -> None:
        total = 0
        for n in range(50):
            used = (seed * 31 + n * 7) % 97
            settled_request(used)
            closing.request_ended()
            total += used
        engine.decide([check(compiled)], dry_run=True)  # carries what still waits on this thread's connection
        totals.append(total)

    threads = [threading.Thread(target=requests, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _until(lambda: counted(private.port, compiled) == sum(totals))
