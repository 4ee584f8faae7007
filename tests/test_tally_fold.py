"""A flush folds the decisions noted since the last one by column (tally._fold_noted): what it adds to the
totals, the live index and the active subjects is what folding each record alone, in order, adds."""

from __future__ import annotations

import random
import sys

import pytest

from ratelimit_app.engine.tally import NOTED, _fold, _fold_noted, _Pending
from tests.helpers import policy


def _records(policies, rng: random.Random, count: int, mixed: bool) -> list[tuple]:
    """Records as verdicts.py notes them: (policy, member, shard, refused before, exceeded, count, reset ms,
    ms before, now ms, cost); `mixed`: refusals, counters that start or move, costs over 1, shards."""
    now, counts, found = 1_700_000_000_000, {}, []
    for _ in range(count):
        limited = rng.choice(policies) if mixed else policies[0]
        member = f"ip:192.0.2.{rng.randrange(4 if mixed else 1)}"
        shard = rng.randrange(2) if mixed else 0
        cost = rng.choice((1, 1, 1, 3)) if mixed else 1
        now += rng.randrange(0, 40)
        reset = limited.window_ms - now % limited.window_ms
        exceeded = mixed and rng.random() < 0.1
        known = counts.get((limited.name, member))
        counts[(limited.name, member)] = total = (known or 0) + cost
        before = -1 if known is None else rng.choice((-2, reset, reset + rng.randrange(-5_000, 5_000))) if mixed else -2
        refused = mixed and rng.random() < 0.05
        if before == -1 and mixed and rng.random() < 0.5:
            total += rng.randrange(1, 50)  # a new counter's count may weigh the window before (a sliding window)
        elif mixed and rng.random() < 0.02:
            total = rng.randrange(cost)  # a count below the cost (a counter given back meanwhile)
        found.append((limited, member, shard, refused, exceeded, total, reset, before, now, cost))
    return found


@pytest.mark.parametrize("mixed", [False, True])
def test_a_flush_adds_what_folding_each_record_alone_adds(mixed):
    policies = [policy(limit=10**9, window=60), policy(limit=10**9, window=3600),
                policy(limit=10**9, window=60, strategy="sliding_window")]
    rng = random.Random(54)
    for batch in (1, 7, 300, 2_000):
        records = _records(policies, rng, batch, mixed)
        alone, folded = _Pending(), _Pending()
        for record in records:
            _fold(alone, *record)
        noted = [field for record in records for field in record]
        _fold_noted(folded, noted, len(records) - 1)
        _fold_noted(folded, noted, 1)  # what stayed noted: the last record
        assert not noted
        assert dict(folded.counts) == dict(alone.counts)
        assert {k: v for k, v in folded.moves.items() if v} == {k: v for k, v in alone.moves.items() if v}
        assert folded.entries == alone.entries
        assert len(records[0]) == NOTED


def test_counts_of_policies_that_tell_where_a_counter_emptied_and_of_those_that_do_not_are_summed(monkeypatch):
    # a sliding window's record tells where its counter emptied before (ms), a sliding log's does not (-2):
    # counted together, neither is a counter moving to another totals bucket, each folded alone
    folded_alone = []
    monkeypatch.setattr(sys.modules[_fold.__module__], "_fold", lambda pending, *record: folded_alone.append(record))
    told, untold = policy(limit=10**9, window=3600, strategy="sliding_window"), policy(limit=10**9, window=3600)
    now, records = 1_700_000_000_000, []
    for at in range(100):
        reset = 3_600_000 - (now + at) % 3_600_000
        records += [(told, "ip:192.0.2.1", 0, False, False, 901 + at, reset, reset, now + at, 1),
                    (untold, "ip:192.0.2.1", 0, False, False, 901 + at, 3_600_000, -2, now + at, 1)]
    noted, pending = [field for record in records for field in record], _Pending()
    _fold_noted(pending, noted, len(records))
    assert folded_alone == []
    assert dict(pending.counts) == {(told, 0, "a", now // told.totals_bucket_ms): 100,
                                    (untold, 0, "a", now // untold.totals_bucket_ms): 100}
