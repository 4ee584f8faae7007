"""A shard whose keys are split between two masters while its slot moves (a resharding moves a slot's
keys a few at a time): Redis refuses a call on several of its keys with TRYAGAIN, which ran nothing.
Each test failed before the fix: the refusal opened the circuit (every request of the site failed
open for RATELIMIT_BREAKER_SECONDS), and the tally dropped the flush as a lost answer."""

from __future__ import annotations

import signal
import threading

import pytest

from ratelimit_app import engine
from ratelimit_app.engine import RedisCommandError, breaker, keys
from ratelimit_app.engine.tally import NOW, Tally, tally
from tests.cluster import wait_for
from tests.helpers import check, policy, subject
from tests.test_cluster import two_masters  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db


def _split(cluster, moved_key: str) -> tuple[object, object, int]:
    """Start moving the slot of `moved_key` to the other master and move that key alone: its slot's other
    keys stay on the source. The source and the target masters, and the slot."""
    source = cluster.master_of(moved_key)
    [target] = [master for master in cluster.masters if master is not source]
    slot = engine.client().keyslot(moved_key)
    source_id, target_id = (node.client.execute_command("CLUSTER MYID") for node in (source, target))
    target.client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    source.client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    source.client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", moved_key)
    return source, target, slot


def _end_move(cluster, source, target, slot: int) -> None:
    """Move the slot's remaining keys, then hand the slot to the target on every master."""
    rest = source.client.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    if rest:
        source.client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *rest)
    target_id = target.client.execute_command("CLUSTER MYID")
    for master in cluster.masters:
        master.client.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)


def _elsewhere(name: str = "ip:203.0.113.7") -> str:
    """A subject whose shard differs from `name`'s."""
    return next(f"ip:198.51.100.{i}" for i in range(1000)
                if keys.shard_of(subject(f"ip:198.51.100.{i}").key) != keys.shard_of(subject(name).key))


def _counts(*checks) -> list[int]:
    """The units each check's policy counts for its subject, read by a dry run."""
    return [d.count for d in engine.decide(list(checks), dry_run=True).decisions]


def _remaining(*limited) -> list[int]:
    return [d.remaining for d in engine.decide([check(p) for p in limited], dry_run=True).decisions]


def test_a_decision_whose_shard_is_split_by_a_move_is_sent_again_and_counts_once(two_masters):  # noqa: F811
    """Two policies of one subject: one counter moved, the other not yet. The decision is refused
    (TRYAGAIN); it is sent again after a short pause, by when the move has ended, and counts once."""
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    assert engine.decide([check(first), check(second)]).allowed
    moved = keys.counter_key(first, subject().key)
    source, target, slot = _split(two_masters, moved)
    ending = threading.Timer(0.02, _end_move, (two_masters, source, target, slot))
    ending.start()
    try:
        assert engine.decide([check(first), check(second)]).allowed
    finally:
        ending.join()
    assert breaker.open_until == 0.0
    assert _remaining(first, second) == [98, 98]  # the first decision and this one, each once
    assert int(source.client.execute_command("CLUSTER COUNTKEYSINSLOT", slot)) == 0


def test_a_shard_that_stays_split_fails_its_own_decisions_alone_and_opens_no_circuit(two_masters):  # noqa: F811
    """The move lasts (a slot of many keys): the subject's decision follows the failure rule after a few
    sends, counting nothing; the cluster answers, so the circuit stays closed and other shards decide."""
    first, second = policy(limit=100, window=3600), policy(limit=100, window=3600)
    assert engine.decide([check(first), check(second)]).allowed
    moved = keys.counter_key(first, subject().key)
    source, target, slot = _split(two_masters, moved)
    with pytest.raises(RedisCommandError, match="TRYAGAIN"):
        engine.decide([check(first), check(second)])
    assert breaker.open_until == 0.0, "a slot being moved is no outage"
    elsewhere = _elsewhere()
    assert engine.decide([check(first, elsewhere), check(second, elsewhere)]).allowed
    _end_move(two_masters, source, target, slot)
    assert _remaining(first, second) == [99, 99]  # the refused call counted nothing


def test_a_flush_refused_while_its_shard_is_split_is_kept_and_reaches_the_slots_new_master(two_masters):  # noqa: F811
    """The shard's totals moved, its live index not yet: the tally's flush is refused (TRYAGAIN) and
    ran nothing. The counts are kept for a later flush, which brings them to the target."""
    limited = policy(limit=100, window=3600)
    assert engine.decide([check(limited)]).allowed
    tally.flush()  # the shard's totals and live index exist, on one master
    shard = keys.shard_of(subject().key)
    totals, live = keys.totals_key(limited, shard), keys.live_key(limited, shard)
    assert two_masters.master_of(totals).client.exists(totals, live) == 2
    source, target, slot = _split(two_masters, totals)
    own = Tally()
    own._pending.counts[(limited, shard, "a", NOW)] = 5
    own.flush()
    if own._flusher is not None:
        own._flusher.cancel()  # kept for a retry: the test flushes once the move has ended
        own._flusher = None
    _end_move(two_masters, source, target, slot)
    own.flush()
    allowed = sum(int(v) for k, v in target.client.hgetall(totals).items() if str(k)[:1] == "a" and k != "ac")
    assert allowed == 6, "the first request and the 5 the refused flush held"


def _cluster_state(node) -> str:
    return node.client.cluster("info")["cluster_state"]


def test_a_flush_refused_while_the_cluster_is_down_is_kept_and_reaches_redis_once_it_is_up(two_masters, caplog):  # noqa: F811
    """A master stops answering (frozen): the other judges the cluster down and refuses every call
    (CLUSTERDOWN), which ran nothing. The flush's counts are kept, not dropped as possibly sent, and
    reach Redis once the cluster is up again."""
    limited = policy(limit=100, window=3600)
    assert engine.decide([check(limited)]).allowed
    tally.flush()
    shard = keys.shard_of(subject().key)
    totals = keys.totals_key(limited, shard)
    alive = two_masters.master_of(totals)
    [frozen] = [master for master in two_masters.masters if master is not alive]
    own = Tally()
    own._pending.counts[(limited, shard, "a", NOW)] = 5
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: _cluster_state(alive) == "fail", 20, "the cluster to be judged down")
        own.flush()
        if own._flusher is not None:
            own._flusher.cancel()  # kept for a retry: the test flushes once the cluster is up
            own._flusher = None
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    assert "may not have reached" not in caplog.text
    wait_for(lambda: _cluster_state(alive) == "ok", 20, "the cluster to be up again")
    own.flush()
    allowed = sum(int(v) for k, v in alive.client.hgetall(totals).items() if str(k)[:1] == "a" and k != "ac")
    assert allowed == 6, "the first request and the 5 the refused flush held"
