"""Admitted requests reach a policy's totals from the worker that admitted them (tally.py): a moment
later from a running worker, at once from one that exits, never twice."""

from __future__ import annotations

import time

import pytest

from ratelimit_app import engine, keys, live
from ratelimit_app.tally import FLUSH_SECONDS
from tests.helpers import check, in_processes, policy

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
