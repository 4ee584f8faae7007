"""Hostile review of 902c5e0 (a shard's denial stands while another is split; give-backs follow a moving
slot) and 287bf02 (READONLY ran nothing), on real servers: a local Redis Cluster of two masters, a local
Sentinel. Where a fault must begin between the look and the count of a decision across shards, the real
`_pipelined` is wrapped to act on the real servers after the look: nothing of Redis is mocked.
The defects first (each failed for its reason before its fix, 2026-12-06), then test_guard_*: attacks
that held."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.test import RequestFactory

from ratelimit_app import engine
from ratelimit_app.deny_cache import deny_cache
from ratelimit_app.engine import giveback, keys, shards
from ratelimit_app.engine.tally import NOW, Tally, tally
from ratelimit_app.policies import compile_policy
from ratelimit_app.subjects import subject_for
from ratelimit_app.values import Held
from tests.faults.test_resharding import _counts, _elsewhere, _end_move, _split
from tests.helpers import check, count_round_trips, make_policy, policy, subject
from tests.test_cluster import two_masters  # noqa: F401 - a fixture
from tests.test_sentinel import sentinel  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

WHO = "ip:203.0.113.7"
IP = "203.0.113.7"


def _after_look(monkeypatch, act) -> list:
    """The next look (dry run) of a decision across shards runs as ever, then `act()` runs on the real
    servers before anything else is sent; its result is kept in the list returned."""
    real, done = shards._pipelined, []

    def pipelined(redis_client, groups, call, **options):
        replies = real(redis_client, groups, call, **options)
        if call.dry_run and not done and len(groups) > 1:
            done.append(None)
            done[0] = act()
        return replies

    monkeypatch.setattr(shards, "_pipelined", pipelined)
    return done


SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")


def _script_calls(cluster) -> int:
    """The decide scripts the masters ran (FCALL, EVALSHA, EVAL, and their _RO forms) since CONFIG RESETSTAT."""
    return sum(stats["calls"] for master in cluster.masters
               for name, stats in master.client.info("commandstats").items()
               if name.split("_", 1)[1].split("|")[0] in SCRIPT_COMMANDS)


def _owed_forgotten() -> None:
    giveback.owed.forget()
    timer = giveback.owed._timer
    if timer is not None:
        timer.cancel()
        giveback.owed._timer = None


# --- defects ----------------------------------------------------------------------------------------


# Defect, fixed. The rule 902c5e0 states ("a request is denied when a shard that answered denies it, even while another
# shard's slot is being moved") holds for the look only: the counting pass still calls _pipelined with
# raise_on_error True (engine/shards.py:51, `counted = _pipelined(redis_client, groups, call)`), so when a
# shard fills up between the look and the count (a concurrent request) while another shard is split, the
# split shard's TRYAGAIN is raised and the answered denial is thrown away: the request follows
# RATELIMIT_FAIL_OPEN (admitted, 200, over the limit that shard just enforced). Fix: read the count's
# answers apart too; a shard that answered with a denial denies the request (its places and the errored
# shards' given back by lease, as _refused_holds_nothing does), and only raise when none denied.
def test_a_denial_in_the_counting_pass_stands_while_another_shard_is_split(two_masters, monkeypatch):  # noqa: F811
    limited = policy(limit=2, window=3600)
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(limited)]).allowed  # one place of two left
    assert engine.decide([check(first, other), check(second, other)]).allowed

    def fill_and_split():
        assert engine.decide([check(limited)]).allowed  # a concurrent request takes the last place
        return _split(two_masters, keys.counter_key(first, subject(other).key))

    split = _after_look(monkeypatch, fill_and_split)
    try:
        verdict = engine.decide([check(limited), check(first, other), check(second, other)])
    finally:
        monkeypatch.undo()
        if split:
            _end_move(two_masters, *split[0])
    assert not verdict.allowed


# Defect, fixed. 902c5e0 moved the dry run's early return: a look (dry_run: caller_usage, compat look(), the tester)
# across shards that a shard denies now sends a second, dry, pipeline to the denying shards as if to
# "record the refusal" (engine/shards.py:45-47: `if denying:` runs for dry runs too, with `call` still a
# dry run); before, `if call.dry_run: return _merged(...)` came first. One more round trip and script run
# per denied look, for nothing (a dry run records nothing). Fix: `if denying and not call.dry_run:`.
def test_a_denied_look_across_shards_runs_one_script_per_shard(two_masters):  # noqa: F811
    limited, elsewhere = policy(limit=1, window=3600), policy(limit=100, window=3600)
    other = _elsewhere()
    both = [check(limited), check(elsewhere, other)]
    assert engine.decide(both, dry_run=True).allowed  # every master has what a look runs, loaded
    assert engine.decide([check(limited)]).allowed  # WHO at its limit
    tally.flush()
    with tally._flushing:
        for master in two_masters.masters:
            master.client.config_resetstat()
        assert not engine.decide(both, dry_run=True).allowed
        calls = _script_calls(two_masters)
    assert calls == 2, f"{calls} scripts ran for a look of two shards"


# Defect, fixed. 287bf02 keeps a flush refused with READONLY ("the address leads to a replica until it follows a
# failover"), but behind Sentinel, the setup where that happens, redis-py's SentinelManagedConnection
# turns READONLY into ConnectionError("The previous master is now a slave") (redis/sentinel.py:83-91).
# batches.read_replies takes that for a lost answer (batches.py:174-186, `answered` False,
# ran_nothing False), so tally.py drops the counts with "may not have reached Redis": the totals and the
# live page miss them. Fix: tell that ConnectionError apart (its message, or ReadOnlyError as its
# __context__) in read_replies/ran_nothing: it ran nothing.
def test_a_flush_refused_by_a_demoted_master_behind_sentinel_is_kept(sentinel, caplog):  # noqa: F811
    limited = policy(limit=100, window=3600)
    assert engine.decide([check(limited)]).allowed
    tally.flush()
    admin = sentinel.master.client
    own = Tally()
    own._pending.counts[(limited, 0, "a", NOW)] = 5
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # demoted; the sentinel has not noticed yet
    try:
        own.flush()
        if own._flusher is not None:
            own._flusher.cancel()
            own._flusher = None
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
    own.flush()
    fields = admin.hgetall(keys.totals_key(limited, 0))
    allowed = sum(int(v) for k, v in fields.items() if k[:1] == "a" and k != "ac")
    assert "may not have reached" not in caplog.text
    assert allowed == 6, "the decision's own one and the five the refused flush held"


# Defect, fixed. Owed is bounded (LIMIT), but places dropped past it are logged with `breaker.cause`
# (engine/giveback.py:140-141), the last *outage*: a give-back owed because its slot is split (TRYAGAIN,
# no outage, the circuit closed) is logged with an empty or stale cause, so the operator reads why
# places were lost from an unrelated, old outage or from nothing. Fix: keep the refusal that made the
# places owed (e.g. owed.add(held, cause)) and log that one.
def test_give_backs_dropped_while_a_slot_is_split_are_logged_with_their_cause(two_masters, monkeypatch, caplog):  # noqa: F811
    first, second = (policy(strategy="concurrency", limit=1, window=300) for _ in range(2))
    checks = [check(first), check(second)]
    assert engine.decide(checks, lease="ended").allowed
    source, target, slot = _split(two_masters, keys.counter_key(first, subject().key))
    monkeypatch.setattr(giveback.owed, "LIMIT", 1)
    try:
        with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
            engine.release([Held(c.policy, c.subject, "ended", 1) for c in checks])  # TRYAGAIN: owed, one dropped
        assert len(giveback.owed.places) == 1  # bounded (this part holds)
    finally:
        _owed_forgotten()
        _end_move(two_masters, source, target, slot)
    [logged] = [r.getMessage() for r in caplog.records if "not given back" in r.getMessage()]
    assert "TRYAGAIN" in logged, logged


# --- attacks that held -----------------------------------------------------------------------------


def _q_in_another_shard(ip_row, q_row) -> str:
    factory = RequestFactory()
    ip_spec, q_spec = compile_policy(ip_row).key_spec, compile_policy(q_row).key_spec
    for i in range(1000):
        request = factory.get(f"/demo/search/?q=w{i}", REMOTE_ADDR=IP)
        if keys.shard_of(subject_for(ip_spec, request).key) != keys.shard_of(subject_for(q_spec, request).key):
            return f"w{i}"
    raise AssertionError("no query in another shard")


def test_guard_a_cross_shard_refusal_while_a_shard_is_split_is_a_429_with_its_headers_then_from_memory(
        client, two_masters, settings):  # noqa: F811
    """Through the middleware: the per-IP policy denies in its shard while the query's shard is split.
    The client gets 429 (not 500, not admitted by fail-open) with Retry-After and the denying policy's
    RateLimit item; the refusal (fewer decisions than checks) is remembered: the next one asks no Redis."""
    settings.RATELIMIT_FAIL_OPEN = True
    per_ip = make_policy(name="search-per-ip", action="demo:search", limit=1, window=3600)
    per_q = make_policy(name="search-per-q", action="demo:search", limit=100, window=3600, key="get:q")
    make_policy(name="search-per-q-2", action="demo:search", limit=100, window=3600, key="get:q")
    q = _q_in_another_shard(per_ip, per_q)
    url = f"/demo/search/?q={q}"
    assert client.get(url, REMOTE_ADDR=IP).status_code == 200
    q_subject = subject_for(compile_policy(per_q).key_spec, RequestFactory().get(url, REMOTE_ADDR=IP))
    moving = _split(two_masters, keys.counter_key(compile_policy(per_q), q_subject.key))
    try:
        refused = client.get(url, REMOTE_ADDR=IP)
    finally:
        _end_move(two_masters, *moving)
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 1
    assert '"search-per-ip";r=0' in refused.headers["RateLimit"]
    with count_round_trips() as trips:
        assert client.get(url, REMOTE_ADDR=IP).status_code == 429
    assert trips[0] == 0, "the refusal was not remembered"


def test_guard_the_deny_cache_keys_a_short_refusal_by_its_override_limit_and_cost(two_masters):  # noqa: F811
    """A refusal across shards with a split shard carries one decision for three checks; remembered, it
    answers the same subject, limit (an override's 1, not the policy's 10) and cost only."""
    limited = policy(limit=10, window=3600)
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(limited, limit=1)]).allowed
    assert engine.decide([check(first, other), check(second, other)]).allowed
    deny_cache.clear()
    epoch = deny_cache.epoch
    moving = _split(two_masters, keys.counter_key(first, subject(other).key))
    try:
        verdict = engine.decide([check(limited, limit=1), check(first, other), check(second, other)])
    finally:
        _end_move(two_masters, *moving)
    assert not verdict.allowed and [d.policy for d in verdict.decisions] == [limited]
    deny_cache.remember(verdict.decisions, epoch)
    assert [d.limit for d in deny_cache.denied([check(limited, limit=1), check(first, other)])] == [1]
    assert deny_cache.denied([check(limited)]) == []  # the policy's own limit: another question
    assert deny_cache.denied([check(limited, limit=1)], cost=2) == []
    deny_cache.clear()


def test_guard_a_refusal_whose_record_is_refused_gives_back_its_own_place_only(two_masters, monkeypatch):  # noqa: F811
    """Another request B holds a place of an in-flight policy (2 places). Request A is denied by a fixed
    window in the same shard; that shard splits before the record (TRYAGAIN), so A's place is given back
    by its lease, never taken: B's place stays, A holds none, and exactly one more request fits."""
    in_flight, limited = policy(strategy="concurrency", limit=2, window=300), policy(limit=1, window=3600)
    elsewhere = policy(limit=100, window=3600)
    other = _elsewhere()
    assert engine.decide([check(in_flight)], lease="B").allowed
    assert engine.decide([check(limited)]).allowed  # WHO at its limit
    split = _after_look(monkeypatch, lambda: _split(two_masters, keys.counter_key(limited, subject().key)))
    try:
        verdict = engine.decide([check(limited), check(in_flight), check(elsewhere, other)], lease="A")
    finally:
        monkeypatch.undo()
        if split:
            _end_move(two_masters, *split[0])
    assert not verdict.allowed
    engine.release([])  # whatever was owed goes now
    assert not giveback.owed.places
    assert _counts(check(in_flight)) == [1], "B's place (and only it) is in flight"
    assert engine.decide([check(in_flight)], lease="C").allowed
    assert not engine.decide([check(in_flight)], lease="D").allowed


def test_guard_an_async_give_back_refused_while_its_slot_is_split_is_owed_then_frees(two_masters):  # noqa: F811
    first, second = (policy(strategy="concurrency", limit=1, window=300) for _ in range(2))
    checks = [check(first), check(second)]
    assert engine.decide(checks, lease="ended").allowed
    source, target, slot = _split(two_masters, keys.counter_key(first, subject().key))
    try:
        asyncio.run(engine.arelease([Held(c.policy, c.subject, "ended", 1) for c in checks]))
        assert len(giveback.owed.places) == 2  # TRYAGAIN: ran nothing, owed
    finally:
        _end_move(two_masters, source, target, slot)
    engine.release([])
    assert not giveback.owed.places
    assert _counts(*checks) == [0, 0]
    _owed_forgotten()
