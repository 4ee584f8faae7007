"""Hostile review of fcbb2ec (a quota absent in the counting pass: every shard's absent quotas raised together,
the other shards' places given back by lease first; a give-back that fails is owed), on real servers: a local
Redis Cluster of two masters. Where a fault must begin between the look and the count, the real `_pipelined`
is wrapped (_after_look); where it must end before the decision is made again, the real `quotas.saved` is
wrapped: nothing of Redis is mocked. The defects first (each failed for its reason before its fix,
2026-12-06), then test_guard_*: attacks that held."""

from __future__ import annotations

import pytest

from ratelimit_app import engine, quotas
from ratelimit_app.engine import RedisCommandError, giveback, keys
from tests.faults.test_resharding import _counts, _elsewhere, _end_move, _split
from tests.faults.test_review_count_pass import _monthly, _on_the_other_master
from tests.faults.test_review_shards import _after_look, _owed_forgotten
from tests.helpers import check, policy, subject
from tests.test_cluster import two_masters  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)

WHO = "ip:203.0.113.7"


def _used(monthly, who: str = WHO, used: int = 1) -> None:
    """`used` units of WHO's monthly quota counted, saved in the database, then its counter lost in Redis."""
    for _ in range(used):
        assert engine.decide([check(monthly, who)]).allowed
    quotas.saver.save()
    engine.client().delete(keys.counter_key(monthly, subject(who).key))


def _evict(monthly, who: str = WHO):
    def act():
        quotas.saver.save()
        engine.client().delete(keys.counter_key(monthly, subject(who).key))
    return act


def _counting_saved(monkeypatch, before=None) -> list:
    """The real quotas.saved (the engine's hooks.saved_usage), counted (and `before()` run first, once): how
    often the usage was read."""
    real, calls = engine.hooks.saved_usage, []

    def saved(checks, now_ms):
        if before is not None and not calls:
            before()
        calls.append(list(checks))
        return real(checks, now_ms)

    monkeypatch.setattr(engine.hooks, "saved_usage", saved)
    return calls


def _deciding_with_saved_reads(monkeypatch, checks) -> tuple:
    """engine.decide(checks), and the reads of the saved usage it made."""
    reads = _counting_saved(monkeypatch)
    try:
        return engine.decide(checks), reads
    finally:
        monkeypatch.undo()


# --- defects ----------------------------------------------------------------------------------------


# Defect, fixed. The counting pass: WHO's shard reports QuotaAbsent (its counter lost since the look; decide.lua refused
# that shard's whole call, so nothing was taken there), the other shard admits. _give_back (engine/shards.py:83-88)
# counts an Exception entry as "a shard that did not answer may have taken them": the QuotaAbsent shard's
# in-flight policies are given back by lease too. release.lua finds nothing under the lease and leaves a MARK
# (lease:1 scored below zero). The call is then made again with the SAME lease (decision.py:59-64); concurrency.lua's
# take finds the mark ("the worker gave this lease back before this call ran") and holds nothing, yet admits.
# The request runs holding no place: the next request is admitted over the in-flight limit (2 in flight, limit 1).
# Fix: in _give_back, skip QuotaAbsent entries (they ran nothing); more generally never give back, before the call
# made again under the same lease, a place the shard may not hold (a mark there disarms the retry's take).
def test_a_quota_absent_in_the_counting_pass_leaves_the_retry_holding_its_own_shards_place(two_masters, monkeypatch):  # noqa: F811,E501
    monthly = _monthly(100)
    in_flight = policy(strategy="concurrency", limit=1, window=300)  # WHO's, in the shard whose quota is lost
    per_hour = policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(monthly), check(per_hour, other)]).allowed

    _after_look(monkeypatch, _evict(monthly))
    try:
        verdict = engine.decide([check(monthly), check(in_flight), check(per_hour, other)], lease="A")
    finally:
        monkeypatch.undo()
    assert verdict.allowed  # request A is in flight: it holds WHO's only place
    try:
        assert _counts(check(in_flight)) == [1], "an admitted request in flight holds no place"
        assert not engine.decide([check(in_flight)], lease="B").allowed, "B admitted while A is in flight (limit 1)"
    finally:
        _owed_forgotten()


# Defect, fixed. The counting pass: WHO's quota is absent, the other shard's slot is split by a move
# (TRYAGAIN: it ran nothing). The first count's give-back by lease (of the split shard's places) was refused
# too and owed; the call was made again under the SAME lease, admitted, and took its places; the owed
# give-back, sent later, freed a place of a request still in flight: 3 in flight on a limit of 2. Now a shard
# that errored ends the decision with its error (the failure rule) instead of a call made again, and a
# give-back before a call made again is taken by Redis or raised, never owed.
def test_an_owed_give_back_of_the_first_count_frees_no_place_the_retry_holds(two_masters, monkeypatch):  # noqa: F811
    monthly = _monthly(100)
    first = policy(strategy="concurrency", limit=2, window=300)
    second = policy(strategy="concurrency", limit=2, window=300)
    other = _on_the_other_master(first)
    assert keys.shard_of(subject(other).key) != keys.shard_of(subject(WHO).key)
    assert engine.decide([check(monthly), check(first, other), check(second, other)], lease="X").allowed  # X in flight
    moved = keys.counter_key(second, subject(other).key)

    def evict_and_split():
        _evict(monthly)()
        return _split(two_masters, moved)  # `first`'s counter stays on the source: a call on both is TRYAGAIN

    split = _after_look(monkeypatch, evict_and_split)
    owed, real_add = [], giveback.owed.add
    monkeypatch.setattr(giveback.owed, "add", lambda held, *cause: (owed.extend(held), real_add(held, *cause)))
    try:
        with pytest.raises(RedisCommandError, match="TRYAGAIN"):
            engine.decide([check(monthly), check(first, other), check(second, other)], lease="A")
    finally:
        monkeypatch.undo()
        if split:
            _end_move(two_masters, *split[0])
    try:
        assert owed == [], "a give-back of A's lease was left owed"
        # what the limiter keeps of a call that failed, given back at A's end
        engine.release([giveback.Held(p, subject(other), "A", 1) for p in (first, second)])
        assert _counts(check(first, other), check(second, other)) == [1, 1]  # X alone
        assert engine.decide([check(first, other)], lease="C").allowed  # C beside X: 2 on a limit of 2
        assert not engine.decide([check(first, other)], lease="D").allowed
    finally:
        _owed_forgotten()


# --- attacks that held -----------------------------------------------------------------------------


def test_guard_two_shards_whose_quotas_are_both_absent_are_asked_once_and_count_once(two_masters, monkeypatch):  # noqa: F811,E501
    """Both shards' quota counters lost between the look and the count: one QuotaAbsent carries both, one read of
    the saved usage, the call made again once; each quota counts the request once, from its saved usage."""
    monthly = _monthly(100)
    other = _elsewhere()
    assert engine.decide([check(monthly), check(monthly, other)]).allowed  # 1 each

    def evict_both():
        _evict(monthly)()
        engine.client().delete(keys.counter_key(monthly, subject(other).key))

    _after_look(monkeypatch, evict_both)
    verdict, reads = _deciding_with_saved_reads(monkeypatch, [check(monthly), check(monthly, other)])
    assert verdict.allowed
    assert len(reads) == 1 and len(reads[0]) == 2, "the saved usage read once, for both quotas"
    assert _counts(check(monthly), check(monthly, other)) == [2, 2]


def test_guard_absent_in_the_look_on_both_shards_is_one_round(two_masters, monkeypatch):  # noqa: F811
    """Both counters lost before the look: the look's QuotaAbsent carries both; the seeded call ends the loop."""
    monthly = _monthly(100)
    other = _elsewhere()
    _used(monthly, WHO, 3)
    _used(monthly, other, 5)
    verdict, reads = _deciding_with_saved_reads(monkeypatch, [check(monthly), check(monthly, other)])
    assert verdict.allowed and len(reads) == 1
    assert _counts(check(monthly), check(monthly, other)) == [4, 6]


def test_guard_a_look_that_one_shard_denies_and_another_finds_absent_is_denied(two_masters, monkeypatch):  # noqa: F811
    """The look: WHO's shard denies, the other's quota counter is lost. The denial wins at once (no read of the
    saved usage, nothing counted on the other shard), with the denying decision."""
    limited = policy(limit=1, window=3600)
    monthly = _monthly(100)
    other = _elsewhere()
    assert engine.decide([check(limited)]).allowed  # WHO at its limit
    _used(monthly, other, 2)
    verdict, reads = _deciding_with_saved_reads(monkeypatch, [check(limited), check(monthly, other)])
    assert not verdict.allowed
    assert [d.policy for d in verdict.decisions if d.exceeded] == [limited]
    assert not reads
    assert not engine.client().exists(keys.counter_key(monthly, subject(other).key)), "the other shard counted"


def test_guard_a_dry_run_across_shards_with_an_absent_quota_shows_the_saved_usage_and_counts_nothing(two_masters):  # noqa: F811,E501
    monthly = _monthly(10)
    per_hour = policy(limit=100, window=3600)
    other = _elsewhere()
    _used(monthly, WHO, 4)
    assert engine.decide([check(per_hour, other)]).allowed
    verdict = engine.decide([check(monthly), check(per_hour, other)], dry_run=True)
    assert verdict.allowed
    assert [d.count for d in verdict.decisions] == [4, 1]
    assert _counts(check(monthly), check(per_hour, other)) == [4, 1]


def test_guard_a_quota_absent_on_one_shard_of_a_cluster_is_asked_again_with_its_saved_usage(two_masters):  # noqa: F811
    """A call of one shard (raise_on_error True): QuotaAbsent raised, the call made again from the saved usage."""
    monthly = _monthly(3)
    in_flight = policy(strategy="concurrency", limit=1, window=300)
    _used(monthly, WHO, 2)
    assert engine.decide([check(monthly), check(in_flight)], lease="A").allowed  # 3 of 3
    assert _counts(check(monthly), check(in_flight)) == [3, 1]
    assert not engine.decide([check(in_flight)], lease="B").allowed
    engine.release([giveback.Held(in_flight, subject(), "A", 1)])
    assert not engine.decide([check(monthly)], lease="C").allowed  # the quota's saved usage counted


def test_guard_the_retry_keeps_the_place_it_takes_again_on_a_shard_that_admitted(two_masters, monkeypatch):  # noqa: F811
    """The first count: the other shard admits and takes a place by lease A, WHO's quota is absent. That place
    goes back before the call is made again (one thread: given back, then taken again, in that order); the retry
    holds it: at the limit, a second request is refused until A ends."""
    monthly = _monthly(100)
    in_flight = policy(strategy="concurrency", limit=1, window=300)
    other = _elsewhere()
    assert engine.decide([check(monthly), check(in_flight, other)], lease="warm").allowed
    engine.release([giveback.Held(in_flight, subject(other), "warm", 1)])
    _after_look(monkeypatch, _evict(monthly))
    try:
        verdict = engine.decide([check(monthly), check(in_flight, other)], lease="A")
    finally:
        monkeypatch.undo()
    assert verdict.allowed
    engine.release([])
    assert not giveback.owed.places
    assert _counts(check(in_flight, other)) == [1]
    assert not engine.decide([check(in_flight, other)], lease="B").allowed
    engine.release([giveback.Held(in_flight, subject(other), "A", 1)])
    assert engine.decide([check(in_flight, other)], lease="C").allowed
    _owed_forgotten()
