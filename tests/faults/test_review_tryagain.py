"""Hostile review of 80ae2bd (TRYAGAIN sent again after a pause, no outage, kept by the tally) and 70dfdc2
(the give-back reads its replies with the batches reader), on a real local Redis Cluster of two masters.

A slot is split as a resharding splits it: SETSLOT IMPORTING / MIGRATING, then MIGRATE of some keys.
Where a fault must begin between the look and the count of a decision across shards, the real
`_pipelined` is wrapped to split the slot (on the real servers) after the look: nothing is mocked.
The defects (each failed for its reason before its fix, 2026-12-06) come first; test_guard_* are
attacks that held."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from ratelimit_app import engine
from ratelimit_app.engine import RedisCommandError, breaker, giveback, keys, shards
from ratelimit_app.engine.tally import NOW, Tally
from ratelimit_app.values import Held
from tests.faults.test_resharding import _counts, _elsewhere, _end_move, _split
from tests.helpers import check, policy, subject
from tests.test_cluster import two_masters  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

WHO = "ip:203.0.113.7"


def _split_after_look(monkeypatch, cluster, moved_key: str) -> list:
    """The next decision across shards: its look runs as ever, then `moved_key`'s slot is split (that key
    moved alone) before its counting call. Returns [(source, target, slot)] once split."""
    real, split = shards._pipelined, []

    def pipelined(redis_client, groups, call, **options):
        replies = real(redis_client, groups, call, **options)
        if call.dry_run and not split:
            split.append(_split(cluster, moved_key))
        return replies

    monkeypatch.setattr(shards, "_pipelined", pipelined)
    return split


# --- defects ----------------------------------------------------------------------------------------


# Defect, fixed: giveback.send wrote each slot's EVAL to the node of the cached layout and owed only lost
# answers: a give-back refused with TRYAGAIN or ASK (it ran nothing) was dropped, and the places stayed
# taken until the lease (the policy's window) ran out, the subject refused meanwhile.
@pytest.mark.parametrize("refusal", ["tryagain", "ask"])
def test_a_give_back_refused_while_its_slot_moves_frees_the_places(two_masters, refusal):  # noqa: F811
    """Two in-flight policies of one place each, one subject (one slot). A request takes both places;
    while its slot moves, it ends and gives them back. Once the move is over, the next request of the
    subject must be admitted: nothing is in flight."""
    first, second = (policy(strategy="concurrency", limit=1, window=300) for _ in range(2))
    checks = [check(first), check(second)] if refusal == "tryagain" else [check(first)]
    assert engine.decide(checks, lease="ended").allowed
    moved = keys.counter_key(first, subject().key)
    source, target, slot = _split(two_masters, moved)  # "ask": the slot's only key has gone to the target
    engine.release([Held(c.policy, c.subject, "ended", 1) for c in checks])  # refused: TRYAGAIN / ASK
    _end_move(two_masters, source, target, slot)
    engine.release([])  # whatever the give-back left owed goes now
    assert not giveback.owed.places
    assert _counts(*checks) == [0] * len(checks), "places of a request that ended are still taken"
    assert engine.decide(checks, lease="next").allowed


# Defect, fixed: the look of a decision across shards raised the split shard's TRYAGAIN and threw away
# the other shard's denial: the request followed RATELIMIT_FAIL_OPEN (admitted over its limit).
def test_a_denial_in_one_shard_stands_while_another_shard_is_split(two_masters):  # noqa: F811
    """A subject at its limit in one shard; the request's other subject sits in a slot being moved. Redis
    answered the first shard with a denial: the request is denied, not failed (open)."""
    limited = policy(limit=1, window=3600)
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(limited)]).allowed  # WHO is at its limit
    assert engine.decide([check(first, other), check(second, other)]).allowed
    source, target, slot = _split(two_masters, keys.counter_key(first, subject(other).key))
    try:
        verdict = engine.decide([check(limited), check(first, other), check(second, other)])
    finally:
        _end_move(two_masters, source, target, slot)
    assert not verdict.allowed
    assert verdict.decisions[0].exceeded


# Defect, fixed: the refusal's record raised when the denying shard's slot split after the look: the
# denial already known was lost and the request followed RATELIMIT_FAIL_OPEN.
def test_a_denial_known_from_the_look_stands_when_its_shard_splits_before_the_record(two_masters, monkeypatch):  # noqa: F811
    limited, other_policy = policy(limit=1, window=3600), policy(limit=100, window=3600)
    spare = policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(limited), check(spare)]).allowed  # WHO is at `limited`'s limit
    split = _split_after_look(monkeypatch, two_masters, keys.counter_key(limited, subject().key))
    try:
        verdict = engine.decide([check(limited), check(spare), check(other_policy, other)])
    finally:
        monkeypatch.undo()
        if split:
            _end_move(two_masters, *split[0])
    assert not verdict.allowed


# --- attacks that held -----------------------------------------------------------------------------


def test_guard_a_count_refused_after_the_look_leaves_no_place_taken_once_given_back(two_masters, monkeypatch):  # noqa: F811
    """Across shards: the look passes, then the other shard's slot splits; the counting pass counts in
    WHO's shard (an in-flight place) and is refused in the other (TRYAGAIN, five sends). The decision
    fails (the failure rule), the limiter keeps the call's places as the request's and gives them back
    at its end: nothing stays taken, and the refused shard counted nothing."""
    in_flight = policy(strategy="concurrency", limit=1, window=300)
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(first, other), check(second, other)]).allowed
    split = _split_after_look(monkeypatch, two_masters, keys.counter_key(first, subject(other).key))
    checks = [check(in_flight), check(first, other), check(second, other)]
    with pytest.raises(RedisCommandError, match="TRYAGAIN"):
        engine.decide(checks, lease="failed")
    monkeypatch.undo()
    assert breaker.open_until == 0.0
    engine.release([Held(in_flight, subject(), "failed", 1)])  # what limiter.conclude keeps, at the request's end
    _end_move(two_masters, *split[0])
    assert _counts(*checks) == [0, 1, 1]
    assert engine.decide([check(in_flight)], lease="next").allowed


def test_guard_ask_then_tryagain_on_the_target_is_sent_there_again_and_counts_once(two_masters):  # noqa: F811
    """The source has none of the call's keys (ASK); the target, asked, lacks one of them (a counter not
    made yet): TRYAGAIN. The call goes to the target again, with ASKING, and counts once when the move
    ends."""
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    assert engine.decide([check(first)]).allowed  # `second`'s counter does not exist
    source, target, slot = _split(two_masters, keys.counter_key(first, subject().key))
    ending = threading.Timer(0.03, _end_move, (two_masters, source, target, slot))
    ending.start()
    try:
        assert engine.decide([check(first), check(second)]).allowed
    finally:
        ending.join()
    assert _counts(check(first), check(second)) == [2, 1]
    assert int(source.client.execute_command("CLUSTER COUNTKEYSINSLOT", slot)) == 0


def test_guard_a_flush_refused_many_times_reaches_redis_once_when_the_move_ends(two_masters):  # noqa: F811
    """The tally's flush of a split shard is refused at every try: kept each time, never added twice
    (its pending counts are merged back, not grown), and the move's end brings them exactly."""
    limited = policy(limit=100, window=3600)
    assert engine.decide([check(limited)]).allowed
    from ratelimit_app.engine.tally import tally
    tally.flush()
    shard = keys.shard_of(subject().key)
    totals = keys.totals_key(limited, shard)
    source, target, slot = _split(two_masters, totals)
    own = Tally()
    own._pending.counts[(limited, shard, "a", NOW)] = 5
    for _ in range(3):
        own.flush()
        if own._flusher is not None:
            own._flusher.cancel()
            own._flusher = None
    assert sum(own._pending.counts.values()) == 5
    _end_move(two_masters, source, target, slot)
    own.flush()
    assert not own._pending
    allowed = sum(int(v) for k, v in target.client.hgetall(totals).items() if str(k)[:1] == "a" and k != "ac")
    assert allowed == 6


def test_guard_a_long_split_logs_once_counts_every_refusal_and_opens_no_circuit(two_masters, caplog):  # noqa: F811
    """Decisions refused while a slot stays split: each is an error Redis answered (counted), the log
    says so once per RATELIMIT_BREAKER_SECONDS, and the circuit stays closed for the other shards."""
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    assert engine.decide([check(first), check(second)]).allowed
    source, target, slot = _split(two_masters, keys.counter_key(first, subject().key))
    errors = breaker.errors
    with caplog.at_level(logging.ERROR, logger="ratelimit_app"):
        for _ in range(3):
            with pytest.raises(RedisCommandError, match="TRYAGAIN"):
                engine.decide([check(first), check(second)])
    other = _elsewhere()
    assert engine.decide([check(first, other), check(second, other)]).allowed
    _end_move(two_masters, source, target, slot)
    assert breaker.errors - errors == 3 and breaker.open_until == 0.0
    assert len([r for r in caplog.records if "no answer to use" in r.getMessage()]) <= 1
    assert _counts(check(first), check(second)) == [1, 1]


def test_guard_adecide_on_a_split_shard_fails_alone_off_the_event_loop(two_masters):  # noqa: F811
    """The async door on a cluster: the pauses run in the worker thread; the loop keeps serving (a
    coroutine alongside finishes first) and the refused call counts nothing, opens no circuit."""
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    assert engine.decide([check(first), check(second)]).allowed
    source, target, slot = _split(two_masters, keys.counter_key(first, subject().key))
    order = []

    async def both():
        async def decision():
            try:
                await engine.adecide([check(first), check(second)])
            except RedisCommandError:
                order.append("refused")

        async def other():
            await asyncio.sleep(0)
            order.append("loop served")

        await asyncio.gather(decision(), other())

    asyncio.run(both())
    _end_move(two_masters, source, target, slot)
    assert order == ["loop served", "refused"] and breaker.open_until == 0.0
    assert _counts(check(first), check(second)) == [1, 1]
