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
from tests.faults.test_connections import use_server
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
