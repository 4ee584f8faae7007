"""Give-backs under connections Redis closes (CLIENT KILL in a loop): a give-back written to a
connection that Redis then closed, unread, is sent again, so no place stays held by a request that
ended."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import RedisCommandError, RedisUnavailable, giveback
from ratelimit_app.values import Held
from tests.faults.test_connections import QUEUED, circuit, use_server  # noqa: F401 - a fixture
from tests.helpers import check, in_threads, policy

pytestmark = pytest.mark.django_db
ROUNDS = 300


def _held(port: int) -> int:
    admin = redis.Redis(port=port)
    try:
        return sum(admin.zcount(key, 0, "+inf") for key in admin.scan_iter(match="*:c*"))
    finally:
        admin.close()


def _killing(port: int, stop: threading.Event) -> threading.Thread:
    def killer():
        admin = redis.Redis(port=port)
        while not stop.wait(0.01):
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        admin.close()

    return threading.Thread(target=killer)


def _until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_give_backs_on_connections_killed_in_a_loop_leave_no_place_held(settings, private):
    """4 threads (2 keep a connection, 2 borrow one per call), each taking a place of its own and
    giving it back 300 times while Redis kills every client each 10 ms: once they ended, and what a
    closed connection kept from Redis is sent again, no place is held."""
    use_server(settings, private.url, max_connections=4)
    inflight = policy(strategy="concurrency", limit=1, window=600)

    def rounds() -> int:
        who = check(inflight, f"ip:203.0.113.{threading.get_ident() % 250}")
        for n in range(ROUNDS):
            lease = f"{threading.get_ident()}-{n}"
            try:
                engine.decide([who], lease=lease)
            except (RedisUnavailable, RedisCommandError):
                pass  # failed open: the place, if the call took one, is given back all the same
            engine.release([Held(who.policy, who.subject, lease, 1)])
        return 0

    stop = threading.Event()
    killer = _killing(private.port, stop)
    killer.start()
    try:
        _, errors = in_threads(rounds, threads=4)
    finally:
        stop.set()
        killer.join()
    assert errors == []
    engine.release([])  # a thread's next give-back reads what its kept connection still owes
    assert _until(lambda: not giveback.owed.places)
    assert _until(lambda: _held(private.port) == 0, 3), f"{_held(private.port)} places held after every request ended"


def test_a_thread_ending_after_a_give_back_leaves_the_pool_nothing_to_misread(settings, private):
    """A thread that gave places back and ended (a timer, a recycled worker thread): its connection
    goes back to the pool, and the site's own cache calls on the same pool read their own replies."""
    use_server(settings, private.url)
    from django.core.cache import caches

    cache = caches["faults"]
    inflight = check(policy(strategy="concurrency", limit=10, window=600))
    wrong = 0
    for n in range(200):
        def request():
            engine.decide([inflight], lease=f"lease-{n}")
            engine.release([Held(inflight.policy, inflight.subject, f"lease-{n}", 1)])

        thread = threading.Thread(target=request)
        thread.start()
        thread.join()
        try:
            cache.set(f"k{n}", n)
            wrong += cache.get(f"k{n}") != n
        except Exception:  # noqa: BLE001 (a reply of another command: an unpickling error, a wrong type)
            wrong += 1
    assert wrong == 0, f"{wrong} of 200 cache calls read another call's reply"


def test_an_async_give_back_cancelled_while_it_waits_for_a_connection_is_owed(settings, private):
    """An async request cancelled (its client went away) while its give-back waits for a connection
    (Redis stalled, here stopped with SIGSTOP): the places are owed and sent later, not held until
    their lease runs out."""
    use_server(settings, private.url)
    inflight = policy(strategy="concurrency", limit=1, window=600)
    who = check(inflight)
    assert engine.decide([who], lease="cancelled-1").allowed
    assert _held(private.port) == 1

    async def cancelled_give_back() -> None:
        task = asyncio.ensure_future(engine.arelease([Held(who.policy, who.subject, "cancelled-1", 1)]))
        await asyncio.sleep(0.05)  # a loop timer: always before the connection's own timeout (0.25 s)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    os.kill(private.process.pid, signal.SIGSTOP)
    try:
        asyncio.run(cancelled_give_back())
    finally:
        os.kill(private.process.pid, signal.SIGCONT)
    assert [held.lease for held in giveback.owed.places] == ["cancelled-1"]
    engine.release([])  # the next give-back sends what is owed
    assert _until(lambda: _held(private.port) == 0)


def test_a_decision_right_after_a_give_back_keeps_the_connection_and_runs_the_give_back_once(settings, private):
    """A thread gives its places back and decides again before Redis answered the give-back (Redis
    paused in between, as a busy server is): the decision reads that reply before its own, on the same
    connection. Before, the connection was closed and the give-back owed: sent a second time, it found
    nothing and left a mark, and a tight loop of such requests sent ever more of them (259 commands a
    request in the bench)."""
    use_server(settings, private.url, timeouts=QUEUED)
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    admin = redis.Redis(port=private.port)
    for n in range(3):  # connected, the scripts loaded
        assert engine.decide([inflight], lease=f"warm-{n}").allowed
        engine.release([Held(inflight.policy, inflight.subject, f"warm-{n}", 1)])
    engine.decide([inflight], dry_run=True)  # the warm give-backs' replies read
    giveback.owed.forget()
    admin.config_resetstat()
    kept = engine.decision_client().connection._sock

    assert engine.decide([inflight], lease="first").allowed
    os.kill(private.process.pid, signal.SIGSTOP)
    resume = threading.Timer(0.2, os.kill, (private.process.pid, signal.SIGCONT))
    try:
        engine.release([Held(inflight.policy, inflight.subject, "first", 1)])  # written, not answered
        resume.start()
        assert engine.decide([inflight], lease="second").allowed
    finally:
        resume.join()
        os.kill(private.process.pid, signal.SIGCONT)
    engine.release([Held(inflight.policy, inflight.subject, "second", 1)])
    engine.decide([inflight], dry_run=True)  # reads the last give-back's reply
    time.sleep(1.5)  # past the owed give-backs' timer: anything owed has been sent by now

    assert giveback.owed.places == []
    assert engine.decision_client().connection._sock is kept, "the kept connection was replaced"
    assert admin.info("commandstats")["cmdstat_eval"]["calls"] == 2, "a give-back was sent twice"
    assert [admin.zrange(key, 0, -1, withscores=True) for key in admin.scan_iter(match="*:c*")] == []  # not a mark


def test_a_decision_waiting_for_a_give_backs_reply_from_a_stalled_redis_is_an_outage(settings, private, circuit):
    """The give-back's reply, which the next decision reads before its own, never comes in time (Redis
    stopped): that decision is an outage like any other, the give-back is owed, and once Redis answers
    again it is sent and no place stays held."""
    use_server(settings, private.url)
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    assert engine.decide([inflight], lease="first").allowed
    os.kill(private.process.pid, signal.SIGSTOP)
    try:
        engine.release([Held(inflight.policy, inflight.subject, "first", 1)])  # written, not answered
        with pytest.raises(RedisUnavailable):
            engine.decide([inflight], lease="second")
        assert [held.lease for held in giveback.owed.places] == ["first"]
        # failed open: the place, if the call took one once Redis runs it, is given back all the same
        engine.release([Held(inflight.policy, inflight.subject, "second", 1)])
    finally:
        os.kill(private.process.pid, signal.SIGCONT)
    engine.breaker.reset()
    assert _until(lambda: not giveback.owed.places)
    assert _until(lambda: _held(private.port) == 0, 3), f"{_held(private.port)} places held"
