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


# what the tally and the verdicts allocate (the notes, their numbers): not what other threads of a test
# process allocate meanwhile, nor the metrics' records, which their own timer folds every second
NOTES = [tracemalloc.Filter(True, "*/ratelimit_app/engine/tally.py"),
         tracemalloc.Filter(True, "*/ratelimit_app/engine/verdicts.py")]


def _retained_while_no_flush_runs(checks, decisions: int) -> int:
    """Bytes the tally's notes still hold after `decisions` more decisions, while no flush can run."""
    gc.collect()
    before = tracemalloc.take_snapshot().filter_traces(NOTES)
    for _ in range(decisions):
        engine.decide(checks)
    gc.collect()
    after = tracemalloc.take_snapshot().filter_traces(NOTES)
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


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
