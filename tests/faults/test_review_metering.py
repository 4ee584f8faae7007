"""A hostile review of metered usage and the closing step, on real servers: a worker forked while its parent
owes settled usage never sends it too (counted twice), nor hangs on a lock its parent held."""

from __future__ import annotations

import pytest

from ratelimit_app import closing, engine
from ratelimit_app.engine import giveback
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
