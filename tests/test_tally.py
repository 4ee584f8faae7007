"""Admitted requests reach a policy's totals from the worker that admitted them (tally.py): a moment
later from a running worker, at once from one that exits, never twice."""

from __future__ import annotations

import itertools
import time

import pytest

from project.devredis import PrivateRedis
from ratelimit_app import engine, live
from ratelimit_app.engine import keys
from ratelimit_app.engine.tally import FLUSH_SECONDS, tally
from tests.helpers import check, in_processes, in_threads, policy, repeated_meanwhile
from tests.relay import Relay

pytestmark = pytest.mark.slow


def _admit_and_exit(limited, start, results, attempts=5):
    start.wait()
    results.put(sum(engine.decide([check(limited, f"ip:192.0.2.{i}")]).allowed for i in range(attempts)))


def test_workers_that_exit_leave_every_admitted_request_in_the_totals():
    limited = policy(limit=100, window=3600)
    admitted = sum(in_processes(_admit_and_exit, (limited,), processes=4))
    assert admitted == 20
    assert live.policy_totals(limited)[:2] == (20, 0)  # no flush of this process had anything to add


def test_a_running_worker_adds_what_it_admitted_by_itself(redis_client):
    limited = policy(limit=100, window=3600)
    for i in range(5):
        engine.decide([check(limited, f"ip:198.51.100.{i}")])
    totals = keys.totals_key(limited, 0)
    assert not redis_client.hexists(totals, "a0")  # the decisions themselves wrote no allowed count

    def counted() -> int:
        return sum(int(v) for k, v in redis_client.hgetall(totals).items() if k.startswith(b"a") and k != b"ac")

    # nobody asks this process to flush: its background thread does (the deadline only stops a hang)
    give_up = time.monotonic() + 30
    while counted() < 5:
        assert time.monotonic() < give_up, f"the background flush never came: {counted()} of 5"
        time.sleep(FLUSH_SECONDS / 5)
    assert counted() == 5


def admit_five(limited) -> None:
    for i in range(5):
        assert engine.decide([check(limited, f"ip:198.51.100.{i}")]).allowed


def test_counts_whose_answer_timed_out_are_never_added_twice(private, settings, caplog):
    with Relay(private.port) as relay:
        own = {**settings.CACHES["default"], "LOCATION": relay.url}
        own["OPTIONS"] = {**own.get("OPTIONS", {}), "SOCKET_TIMEOUT": 0.5}
        settings.CACHES = {**settings.CACHES, "own": own}
        settings.RATELIMIT_CACHE = "own"
        limited = policy(limit=100, window=3600)
        engine.decide([check(policy(), "ip:192.0.2.1")])
        tally.flush()  # connected, the library loaded: the flush below sends only the counts
        with tally._flushing:  # the background flush waits until the answers are held
            admit_five(limited)
            relay.hold_answers()
        try:
            tally.flush()  # the server runs the flush's script; its answer comes after the client gave up
        finally:
            relay.release_answers()
        assert "may not have reached Redis" in caplog.text  # the timeout happened: the case under test
        allowed = live.policy_totals(limited)[0]  # a reader flushes what is left first
    print(f"\nallowed in the totals after a flush whose answer timed out: {allowed} of 5")
    assert allowed == 5


def test_counts_that_could_not_reach_redis_are_added_once_it_is_back(server):
    limited = policy(limit=100, window=3600)
    # the background flush waits until the server is down: all five are pending then (one sent before
    # would be lost with the stopped server's memory, one sent as it stops may have run and is not resent)
    with tally._flushing:
        admit_five(limited)
        server.stop()
    tally.flush()  # refused: kept for later
    back = PrivateRedis(port=server.port).start()
    try:
        assert live.policy_totals(limited)[0] == 5
    finally:
        back.stop()


def test_decisions_noted_while_flushes_run_are_each_counted_once():
    # a decision is noted without a lock (one append) while the flush drains what was noted: none may
    # be lost between the two, nor counted by two flushes
    limited = policy(limit=10**6, window=3600)
    numbers = itertools.count()

    def deciding() -> None:
        who = f"ip:203.0.113.{next(numbers)}"
        for _ in range(300):
            assert engine.decide([check(limited, who)]).allowed

    with repeated_meanwhile(tally.flush):
        assert in_threads(deciding, threads=4)[1] == []
    assert live.policy_totals(limited)[:3] == (1200, 0, 4)
    usage = live.live_usage(limited)
    assert sorted((row.display, row.count) for row in usage.subjects) == [(f"ip:203.0.113.{n}", 300) for n in range(4)]


def test_decisions_waiting_for_the_flush_keep_no_object_of_their_own_for_the_collector():
    # what a decision notes waits for the flush as plain fields: an object kept per request would
    # bring Python's garbage collector to every worker's request path every few hundred requests
    import gc

    limited = policy(limit=10**6, window=3600)
    checks = [check(limited)]
    for _ in range(10):
        engine.decide(checks)
    tally.flush()
    with tally._flushing:  # no flush meanwhile: what the notes keep stays there
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(1000):
            engine.decide(checks)
        kept = len(gc.get_objects()) - before
    assert kept < 100, f"{kept} objects kept by 1,000 decisions"
    assert live.policy_totals(limited)[0] == 1010
