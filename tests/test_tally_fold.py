"""A decision hands the tally the key of a request that only counts and the record of one that writes more
(verdicts.py); a flush sums the keys and folds the records in order: what it adds to the totals, the live
index and the active subjects is what folding each record alone, in order, adds."""

from __future__ import annotations

import random

import pytest

from ratelimit_app.engine.arguments import NO_KEY, SEEN, SEEN_NOTHING, SEEN_REFUSED
from ratelimit_app.engine.tally import NOTED, _fold, _fold_counted, _fold_noted, _Pending
from ratelimit_app.engine import verdicts
from ratelimit_app.engine.arguments import Ask
from ratelimit_app.engine.verdicts import _admitted, _refused
from ratelimit_app.values import Check, Subject
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
        elif mixed and rng.random() < 0.05:
            total = rng.randrange(cost)  # a count below the cost (a counter given back meanwhile)
        found.append((limited, member, shard, refused, exceeded, total, reset, before, now, cost))
    return found


class _Handed:
    """Stands in for the tally: what verdicts.py hands it."""

    def __init__(self) -> None:
        self.noted, self.counted = [], []

    def note(self, noted: list, counted: list) -> None:
        self.noted += noted
        self.counted += counted


def _handed(records: list[tuple], through_verdict: bool = False) -> tuple[list, list]:
    """What verdicts.py hands the tally for these records: (the records of those that write more, the keys
    of those that only count), each subject's check parts kept from one of its decisions to the next; by
    its helpers, or `through_verdict`: by verdict_of reading each record as decide.lua's reply."""
    handed, parts = _Handed(), {}
    for limited, member, shard, refused, exceeded, count, reset, before, now, cost in records:
        sent = parts.setdefault((limited, member, shard), [None, None, member, shard, SEEN_NOTHING, 10**9, 10**9,
                                                           NO_KEY, NO_KEY])
        sent[SEEN] = SEEN_REFUSED if refused else SEEN_NOTHING  # what the subject's decision before here saw
        if through_verdict:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(verdicts, "tally", handed)
                reply = [now, -1 - count if exceeded else count, reset, reset if exceeded else before]
                verdicts.verdict_of([Check(limited, Subject(member, member), limited.limit)], reply,
                                    Ask(now / 1000, False, cost, ""), [sent])
        elif exceeded:
            _refused(limited, sent, count, reset, now, cost, handed.counted, handed.noted)
        else:
            _admitted(limited, sent, count, reset, before, now, cost, handed.counted, handed.noted)
    return handed.noted, handed.counted


@pytest.mark.parametrize("through_verdict", [False, True])
@pytest.mark.parametrize("mixed", [False, True])
def test_a_flush_adds_what_folding_each_record_alone_adds(mixed, through_verdict):
    policies = [policy(limit=10**9, window=60), policy(limit=10**9, window=3600),
                policy(limit=10**9, window=60, strategy="sliding_window")]
    rng = random.Random(54)
    for batch in (1, 7, 300, 2_000):
        records = _records(policies, rng, batch, mixed)
        # each record alone as well: an entry that a later record of its subject replaces shows there
        for flushed in [[record] for record in records] + [records]:
            alone, folded = _Pending(), _Pending()
            for record in flushed:
                _fold(alone, *record)
            handed, counted = _handed(flushed, through_verdict)
            noted = [field for record in handed for field in record]
            if handed:
                _fold_noted(folded, noted, len(handed) - 1)
                _fold_noted(folded, noted, 1)  # what stayed noted: the last record
            _fold_counted(folded, counted, len(counted))
            assert not noted and not counted
            assert dict(folded.counts) == dict(alone.counts)
            assert {k: v for k, v in folded.moves.items() if v} == {k: v for k, v in alone.moves.items() if v}
            assert folded.entries == alone.entries
            assert all(len(record) == NOTED for record in handed)


def test_requests_that_only_count_are_summed_by_their_totals_bucket_not_folded_one_by_one():
    # a sliding window's record tells where its counter emptied before (ms), a sliding log's does not (-2):
    # neither is a counter moving to another totals bucket; past a power of 2 of the count, a request counts
    # and writes nothing more, whatever policy it is of
    told, untold = policy(limit=10**9, window=3600, strategy="sliding_window"), policy(limit=10**9, window=3600)
    now, records = 1_700_000_000_000, []
    for at in range(100):
        reset = 3_600_000 - (now + at) % 3_600_000
        records += [(told, "ip:192.0.2.1", 0, False, False, 901 + at, reset, reset, now + at, 1),
                    (untold, "ip:192.0.2.1", 0, False, False, 901 + at, 3_600_000, -2, now + at, 1)]
    noted, counted = _handed(records)
    assert noted == [] and len({id(key) for key in counted}) == 2  # one key a policy and totals bucket
    pending = _Pending()
    _fold_counted(pending, counted, len(counted))
    assert dict(pending.counts) == {(told, 0, "a", now // told.totals_bucket_ms): 100,
                                    (untold, 0, "a", now // untold.totals_bucket_ms): 100}
