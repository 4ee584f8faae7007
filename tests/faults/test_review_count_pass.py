"""Hostile review of d734dec (a denial from the counting pass stands, each shard's answer read apart; Sentinel's
READONLY kept) and 902c5e0, on real servers: a local Redis Cluster of two masters, a local Sentinel. Where a
fault must begin between the look and the count of a decision across shards, the real `_pipelined` is
wrapped (_after_look) to act on the real servers after the look: nothing of Redis is mocked.
The defects first (each failed for its reason before its fix, 2026-12-06; one kept, xfail), then
test_guard_*: attacks that held."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ratelimit_app import engine, quotas
from ratelimit_app.engine import giveback, keys
from ratelimit_app.engine.batches import read_replies
from ratelimit_app.policies import compile_policy
from tests.faults.test_resharding import _counts, _elsewhere, _end_move, _split
from tests.faults.test_review_shards import _after_look, _owed_forgotten
from tests.helpers import check, make_policy, policy, subject
from tests.test_cluster import two_masters  # noqa: F401 - a fixture
from tests.test_sentinel import sentinel  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

WHO = "ip:203.0.113.7"


def _on_the_other_master(compiled, name: str = WHO) -> str:
    """A subject whose counter of `compiled` lives on the master that does not serve `name`'s."""
    cluster = engine.client()

    def port(who: str) -> int:
        return cluster.get_node_from_key(keys.counter_key(compiled, subject(who).key)).port

    return next(f"ip:198.51.100.{i}" for i in range(1000) if port(f"ip:198.51.100.{i}") != port(name))


def _monthly(limit: int):
    return compile_policy(make_policy(name=f"monthly-{limit}", strategy="calendar_quota", period="month",
                                      time_zone="UTC", limit=limit, window=1))


# --- defects ----------------------------------------------------------------------------------------


# Defect, fixed. In the counting pass, a calendar quota whose counter vanished since the look (evicted, a flush, a
# failover that lost it) makes its shard answer ABSENT; verdict_of raises QuotaAbsent inside the dict
# comprehension of _pipelined (engine/shards.py:95), throwing away the other shards' answers although they
# already counted: `_refused_holds_nothing` never runs for them. decision.deciding (engine/decision.py:59-64)
# asks again with the saved usage; when that second decision is a denial (the saved usage is at the limit),
# only the denying shards are asked again, and the in-flight place the first counting pass took on the
# other shard is never given back (conclude drops it from state.held: the request was refused). A place of
# a request that ended stays taken until its lease runs out: the next request is refused.
# Fix: in _pipelined, turn a shard's QuotaAbsent into its entry (like an error); in _decide_across_shards,
# when the counting pass has one, give back (by lease) what the other shards admitted, then raise it.
@pytest.mark.django_db(transaction=True)
def test_a_quota_absent_in_the_counting_pass_leaves_no_place_of_a_refused_request(two_masters, monkeypatch):  # noqa: F811
    monthly = _monthly(2)
    in_flight = policy(strategy="concurrency", limit=1, window=300)
    other = _elsewhere()
    assert engine.decide([check(monthly), check(in_flight, other)], lease="A").allowed  # monthly: 1 of 2
    engine.release([giveback.Held(in_flight, subject(other), "A", 1)])

    def fill_then_evict():
        assert engine.decide([check(monthly)]).allowed  # a concurrent request takes the quota's last unit
        quotas.saver.save()
        engine.client().delete(keys.counter_key(monthly, subject().key))  # the counter is lost

    _after_look(monkeypatch, fill_then_evict)
    try:
        verdict = engine.decide([check(monthly), check(in_flight, other)], lease="B")
    finally:
        monkeypatch.undo()
    assert not verdict.allowed  # the saved usage (2 of 2) denies: the request holds nothing
    engine.release([])
    assert _counts(check(in_flight, other)) == [0], "a refused request's place is still in flight"


# Defect, the same cause seen on an admitted request: the other shard counted in the lost counting pass,
# then counts again in the decision asked anew: one request counted twice (the user's remaining drops by
# two, the limit admits one request fewer). Fix: as above; or, on QuotaAbsent in the counting pass, ask
# again only the shards that reported it (the others' verdicts stand).
@pytest.mark.django_db(transaction=True)
@pytest.mark.xfail(strict=True, reason=(
    "Kept, not fixed: the decision is made again with the quota's saved usage, and a shard that counted in the "
    "lost counting pass counts again. An under-admission of one request in a race (a counter lost between the "
    "look and the count), never an over-admission, as _decide_across_shards states; asking again only the "
    "absent shards would need the saved usage read inside the cluster path, a second mechanism beside deciding()'s"))
def test_a_quota_absent_in_the_counting_pass_counts_the_other_shard_once(two_masters, monkeypatch):  # noqa: F811
    monthly = _monthly(100)
    per_hour = policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(monthly), check(per_hour, other)]).allowed

    def evict():
        quotas.saver.save()
        engine.client().delete(keys.counter_key(monthly, subject().key))

    _after_look(monkeypatch, evict)
    try:
        assert engine.decide([check(monthly), check(per_hour, other)]).allowed
    finally:
        monkeypatch.undo()
    assert _counts(check(per_hour, other)) == [2], "two requests, each counted once"


# Defect, fixed. The counting pass: shard A denies (filled since the look), shard B's master is gone (its answer an
# error). _refused_holds_nothing gives back B's in-flight places by calling giveback.send directly
# (engine/shards.py:85, from :60), outside any error handling: _send_to_slot -> _send_answered ->
# pool.get_connection() raises ConnectionError for the dead node, which escapes _decide_across_shards, and
# A's denial is lost: the request gets RedisUnavailable (under RATELIMIT_FAIL_OPEN admitted, over A's limit;
# fail closed a 503 where a 429 is due). The look pass's record (shards.py:52-53) has the same path.
# Fix: in _refused_holds_nothing, catch (redis.RedisError, OSError) around giveback.send and owe the
# places (giveback.owed.add(held, error)): the denial stands, the give-back is sent again later.
def test_a_denial_in_the_counting_pass_stands_when_the_give_back_cannot_reach_an_errored_shard(two_masters, monkeypatch):  # noqa: F811,E501
    limited = policy(limit=2, window=3600)
    in_flight = policy(strategy="concurrency", limit=5, window=300)
    other = _on_the_other_master(in_flight)
    assert engine.decide([check(limited)]).allowed  # one place of two left
    port = engine.client().get_node_from_key(keys.counter_key(in_flight, subject(other).key)).port
    [gone] = [master for master in two_masters.masters if master.port == port]

    def fill_and_kill():
        assert engine.decide([check(limited)]).allowed  # a concurrent request takes the last place
        gone.kill()

    _after_look(monkeypatch, fill_and_kill)
    try:
        verdict = engine.decide([check(limited), check(in_flight, other)], lease="A")
    finally:
        monkeypatch.undo()
        _owed_forgotten()
        engine.breaker.reset()
    assert not verdict.allowed


# --- attacks that held -----------------------------------------------------------------------------


def test_guard_a_counted_denial_gives_back_what_admitting_and_split_shards_took(two_masters, monkeypatch):  # noqa: F811
    """Counting pass: WHO's shard denies (filled since the look), X's shard admits and takes an in-flight
    place, Y's shard is split (TRYAGAIN, its place never taken). Denied; once the move ends and what was owed
    is sent, nothing is in flight, and each in-flight policy admits exactly its limit again."""
    limited = policy(limit=2, window=3600)
    first, second = (policy(strategy="concurrency", limit=1, window=300) for _ in range(2))
    moved_too = policy(limit=100, window=3600)
    x = _elsewhere()
    y = next(f"ip:192.0.2.{i}" for i in range(1000)
             if len({keys.shard_of(subject(n).key) for n in (WHO, x, f"ip:192.0.2.{i}")}) == 3)
    assert engine.decide([check(limited)]).allowed
    assert engine.decide([check(second, y), check(moved_too, y)], lease="warm").allowed
    engine.release([giveback.Held(second, subject(y), "warm", 1)])

    def fill_and_split():
        assert engine.decide([check(limited)]).allowed
        return _split(two_masters, keys.counter_key(moved_too, subject(y).key))

    split = _after_look(monkeypatch, fill_and_split)
    try:
        verdict = engine.decide([check(limited), check(first, x), check(second, y), check(moved_too, y)], lease="A")
    finally:
        monkeypatch.undo()
        if split:
            _end_move(two_masters, *split[0])
    assert not verdict.allowed
    engine.release([])
    assert not giveback.owed.places
    assert _counts(check(first, x), check(second, y)) == [0, 0]
    assert engine.decide([check(first, x), check(second, y)], lease="C").allowed
    assert not engine.decide([check(first, x)], lease="D").allowed
    _owed_forgotten()


def test_guard_the_async_door_on_a_cluster_keeps_a_counted_denial_while_a_shard_is_split(two_masters, monkeypatch):  # noqa: F811,E501
    limited = policy(limit=2, window=3600)
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(limited)]).allowed
    assert engine.decide([check(first, other), check(second, other)]).allowed

    def fill_and_split():
        assert engine.decide([check(limited)]).allowed
        return _split(two_masters, keys.counter_key(first, subject(other).key))

    split = _after_look(monkeypatch, fill_and_split)
    try:
        verdict = asyncio.run(engine.adecide([check(limited), check(first, other), check(second, other)]))
    finally:
        monkeypatch.undo()
        if split:
            _end_move(two_masters, *split[0])
    assert not verdict.allowed and [d.policy for d in verdict.decisions] == [limited]
    assert _counts(check(limited), check(first, other), check(second, other)) == [2, 1, 1]


def test_guard_an_error_reply_other_than_readonly_behind_sentinel_is_that_reply_alone(sentinel):  # noqa: F811
    """read_replies on a Sentinel-managed connection: an error reply (not READONLY) is returned as itself,
    the replies after it are read, and the connection stays usable."""
    pool = engine.client().connection_pool
    connection = pool.get_connection()
    try:
        connection.send_packed_command(connection.pack_commands(
            [("SET", "review:k", "text"), ("INCR", "review:k"), ("GET", "review:k")]))
        replies = read_replies(connection, 3)
        connection.send_command("PING")
        assert connection.read_response() in (b"PONG", "PONG", True)
    finally:
        pool.release(connection)
    assert isinstance(replies[1], redis.ResponseError) and not isinstance(replies[1], redis.ConnectionError)
    assert "integer" in str(replies[1])
    assert replies[2] in (b"text", "text")
