"""Review of the tally's notes (a decision's fields wait in a queue until the flush folds them): what
they cost a worker's memory while no flush can run."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from ratelimit_app import engine, live
from ratelimit_app.engine.tally import MOST_NOTED, tally
from tests.helpers import check, policy

pytestmark = pytest.mark.slow


def _retained_while_no_flush_runs(checks, decisions: int) -> int:
    """Bytes the process still holds after `decisions` more decisions, while no flush can run."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(decisions):
        engine.decide(checks)
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


def test_memory_stays_bounded_while_the_flusher_cannot_run():
    # a flush stuck on a stalled server (or a timer whose thread could not start): the notes of every
    # request waited for it, about 184 bytes each, without end (1.8 MB for 10,000 decisions of one subject)
    limited = policy(limit=10**9, window=3600)
    checks = [check(limited, "ip:203.0.113.50")]
    for _ in range(50):
        engine.decide(checks)
    tally.flush()
    tracemalloc.start()
    try:
        with tally._flushing:  # the flusher is stuck: nothing is folded or sent by it meanwhile
            _retained_while_no_flush_runs(checks, 2 * MOST_NOTED)  # past the most that may wait
            more = _retained_while_no_flush_runs(checks, 2 * MOST_NOTED)
    finally:
        tracemalloc.stop()
    # one subject, one policy: past the bound, what waits does not grow with the number of requests
    assert more < 50_000, f"{2 * MOST_NOTED:,} more decisions of one subject kept {more:,} bytes"
    assert live.policy_totals(limited)[0] == 50 + 4 * MOST_NOTED  # and each is counted once
