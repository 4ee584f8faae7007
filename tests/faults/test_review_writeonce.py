"""Hostile review of run_each written once (engine/batches.py) and of the tally's retry with backoff
(engine/tally.py), against real Redis servers and clusters only: the three defects found (each failed
for its reason before its fix) and the guards, attacks that held."""

from __future__ import annotations

import logging
import signal

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import keys
from ratelimit_app.engine.tally import FLUSH_SECONDS, NOW, Tally, tally
from tests.cluster import LocalCluster, wait_for, wait_replicated
from tests.helpers import check, policy, subject
from tests.test_cluster import two_masters, use  # noqa: F401 - two_masters is a fixture
from tests.test_sentinel import sentinel  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db


def _allowed(fields: dict) -> int:
    return sum(int(v) for k, v in fields.items() if str(k)[:1] == "a" and k != "ac")


def _disarmed(own: Tally) -> float | None:
    armed, own._flusher = own._flusher, None
    if armed is None:
        return None
    armed.cancel()
    return armed.interval


def test_a_cluster_flush_answered_moved_is_sent_where_the_slot_lives(two_masters):  # noqa: F811
    """Defect, fixed: the tally now flushes through the cluster client. A slot moved to another master (a resharding, a
    failover) since the worker last read the cluster's layout: the tally's flush for that shard is answered MOVED,
    which ran nothing. run_each resends MOVED only on a RedisCluster client, but the tally hands it each master's
    own redis.Redis (tally.py _servers, then batches.py run_each: `isinstance(reply, MovedError) and node_of` is
    false with node_of None, so the MovedError is raised like a lost answer); tally.py's `except redis.RedisError`
    logs "may not have reached Redis" and drops the counts, and the layout is never read again, so every later flush
    of that shard is dropped too. The operator's totals miss every request admitted in those shards until something
    else refreshes the client's layout."""
    limited = policy(limit=100, window=3600)
    redis_client = engine.client()  # knows the layout now
    totals = keys.totals_key(limited, 0)
    source = two_masters.master_of(totals)
    [target] = [master for master in two_masters.masters if master is not source]
    slot = redis_client.keyslot(totals)
    target_id = target.client.execute_command("CLUSTER MYID")
    for master in two_masters.masters:  # the slot holds no key yet: moved at once
        master.client.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    own = Tally()
    for flush in range(2):
        own._pending.counts[(limited, 0, "a", NOW)] = 5
        own.flush()
        _disarmed(own)
    assert _allowed(target.client.hgetall(totals)) == 10, "10 admitted requests flushed, MOVED ran none of them"


def test_a_cluster_flush_with_two_masters_down_backs_off_once_per_flush(two_masters):  # noqa: F811
    """Defect, fixed: one backoff step per failed flush. The backoff doubled in Tally._put_back (tally.py), which _flush
    calls once per unreachable server: with two masters down one failed flush doubles it twice, so the retries wait
    0.25 s, 1 s, 4 s instead of 0.25 s, 0.5 s, 1 s, 2 s, 4 s as documented (failure-modes.md: "then twice as long
    after each failure"); with three masters down they wait 0.25 s, 2 s, then 4 s."""
    limited = policy(limit=100, window=3600)
    redis_client = engine.client()
    first = two_masters.master_of(keys.totals_key(limited, 0))
    other = next(shard for shard in range(1, 16) if two_masters.master_of(keys.totals_key(limited, shard)) is not first)
    own = Tally()
    own._heartbeat_due = float("inf")  # only the flushes' own writes
    for master in two_masters.masters:
        master.stop()
    intervals = []
    for _ in range(3):
        own._pending.counts[(limited, 0, "a", NOW)] = 1
        own._pending.counts[(limited, other, "a", NOW)] = 1
        own.flush()
        intervals.append(_disarmed(own))
    assert redis_client is engine.client()
    assert intervals == [FLUSH_SECONDS, 2 * FLUSH_SECONDS, 4 * FLUSH_SECONDS], intervals


class RequestTimeout(BaseException):
    """What a request timeout raised in the worker's thread looks like (gevent.Timeout, a SIGALRM handler)."""


def _subjects_on(cluster: LocalCluster, limited) -> tuple[str, str]:
    """Two subjects whose counters live on different masters."""
    by_master = {}
    for i in range(200):
        name = f"ip:198.51.100.{i}"
        master = cluster.master_of(keys.counter_key(limited, subject(name).key))
        by_master.setdefault(master.port, name)
        if len(by_master) == 2:
            return tuple(by_master.values())
    raise AssertionError("no two masters")


def test_a_decision_interrupted_on_one_master_leaves_no_reply_for_the_other_masters_next_user(two_masters, settings):  # noqa: F811
    """Defect, fixed: a connection not read to its end is closed. A decision across two masters is interrupted (a
    request timeout raised in the thread, as gevent.Timeout or a SIGALRM handler do) while it waits for the first
    master's reply: redis-py closes that connection, but batches.py _write_once's `finally` gives the second master's
    connection back to its pool with the decision's reply still to come. The pool's check sees nothing yet (the
    master is slow), so its next user writes its own command and reads that reply as its own: another request's
    decision (or an ECHO here) gets a verdict that is not its own."""
    use(two_masters, settings, socket_timeout=5)
    limited = policy(limit=100, window=3600)
    first, second = _subjects_on(two_masters, limited)
    engine.decide([check(limited, first), check(limited, second)], dry_run=True)  # connected, layout known
    redis_client = engine.client()
    nodes = [redis_client.get_node_from_key(keys.counter_key(limited, subject(name).key)) for name in (first, second)]

    def interrupt(*_args):
        raise RequestTimeout()

    for master in two_masters.masters:  # both masters slow: every reply comes 0.6 s late
        master.client.execute_command("CLIENT", "PAUSE", 600, "ALL")
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.15)
    try:
        with pytest.raises(RequestTimeout):
            engine.decide([check(limited, first), check(limited, second)], dry_run=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    echoed = [redis_client.get_redis_connection(node).execute_command("ECHO", "mine") for node in nodes]
    assert echoed == [b"mine", b"mine"], f"ECHO answered with another call's reply: {echoed}"


def _calls_run(node_client) -> int:
    stats = node_client.info("commandstats")
    return sum(stats.get(name, {}).get("calls", 0) for name in ("cmdstat_fcall", "cmdstat_evalsha"))


def test_guard_a_flush_after_redis_closed_the_idle_connections_is_sent_once_not_kept(server, caplog):
    """Guard. Redis closed every connection of the worker while it rested (CLIENT KILL, an idle
    `timeout`): the flush takes a new one (the pool's check), writes once and reaches Redis; nothing
    is logged as lost or kept, and the backoff starts over."""
    limited = policy(limit=100, window=3600)
    engine.decide([check(limited, "ip:192.0.2.1")])
    tally.flush()
    admin = redis.Redis(port=server.port)
    try:
        own = Tally()
        own._pending.counts[(limited, 0, "a", NOW)] = 5
        admin.client_kill_filter(_type="normal", skipme=True)
        with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
            own.flush()
        assert not own._pending and _disarmed(own) is None and own._retry_in == FLUSH_SECONDS
        assert not [r for r in caplog.records if "totals" in r.getMessage()]
        fields = {k.decode(): v for k, v in admin.hgetall(keys.totals_key(limited, 0)).items()}
        assert _allowed(fields) == 6  # the decision's own one, and these five once
    finally:
        admin.close()


def test_guard_a_decision_across_masters_after_they_closed_their_idle_connections_counts_once(two_masters):  # noqa: F811
    """Guard. Both masters closed the worker's resting connections (CLIENT KILL): a decision that spans
    them is taken on new connections, not reported as an outage, and counts once on each master."""
    limited = policy(limit=100, window=3600)
    first, second = _subjects_on(two_masters, limited)
    assert engine.decide([check(limited, first), check(limited, second)]).allowed
    for master in two_masters.masters:
        master.client.client_kill_filter(_type="normal", skipme=True)
    assert engine.decide([check(limited, first), check(limited, second)]).allowed
    both = [check(limited, first), check(limited, second)]
    remaining = [d.remaining for d in engine.decide(both, dry_run=True).decisions]
    assert remaining == [98, 98]


def test_guard_one_call_refused_among_many_leaves_the_others_counted_once_and_the_connection_clean(server, settings):
    """Guard. Redis answers one shard's flush with an error (WRONGTYPE: its totals key is a string) among
    200 shards' calls written together: the other 199 run once, nothing is sent again, and the pooled
    connection's next user reads its own reply."""
    settings_shards = settings.RATELIMIT_SHARDS = 200
    limited = policy(limit=100, window=3600)
    admin = redis.Redis(port=server.port)
    try:
        admin.set(keys.totals_key(limited, 7), "not a hash")
        own = Tally()
        engine.decide([check(limited, "ip:192.0.2.1")], dry_run=True)
        tally.flush()  # the library is loaded: no call is refused for lack of it
        for shard in range(settings_shards):
            own._pending.counts[(limited, shard, "a", NOW)] = 1
        before = _calls_run(admin)
        own.flush()
        _disarmed(own)
        assert _calls_run(admin) - before == settings_shards  # each shard's call written once
        counted = sum(_allowed({k.decode(): v for k, v in admin.hgetall(keys.totals_key(limited, s)).items()})
                      for s in range(settings_shards) if s != 7)
        assert counted == settings_shards - 1
        assert engine.client().execute_command("ECHO", "mine") == b"mine"
    finally:
        admin.close()


def test_guard_redirections_that_point_at_each_other_end_after_a_bounded_number_of_sends(two_masters):  # noqa: F811
    """Guard. A slot left MIGRATING on its source while the target never imports it (a resharding tool
    that died half-way): the source answers ASK, the target MOVED back. run_each does not loop: the
    decision ends with an error after at most five sends, and nothing counted."""
    limited = policy(limit=100, window=3600)
    assert engine.decide([check(limited)]).allowed
    counter = keys.counter_key(limited, subject().key)
    source = two_masters.master_of(counter)
    [target] = [master for master in two_masters.masters if master is not source]
    slot = engine.client().keyslot(counter)
    source.client.delete(counter)  # gone from the source: every call is redirected
    source.client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.client.execute_command("CLUSTER MYID"))
    stats = [master.client.info("commandstats") for master in (source, target)]

    def sends(before: list) -> int:
        after = [master.client.info("commandstats") for master in (source, target)]
        return sum(a.get(n, {}).get(f, 0) - b.get(n, {}).get(f, 0) for a, b in zip(after, before)
                   for n in ("cmdstat_fcall", "cmdstat_evalsha") for f in ("calls", "rejected_calls"))

    with pytest.raises(Exception):
        engine.decide([check(limited)])
    assert 2 <= sends(stats) <= 5
    assert [int(m.client.execute_command("CLUSTER COUNTKEYSINSLOT", slot)) for m in (source, target)] == [0, 0]


def test_counts_pending_across_a_sentinel_failover_reach_the_new_master(sentinel):  # noqa: F811
    """Guard. A forced failover (SENTINEL FAILOVER: the master becomes the replica of its former replica)
    while a worker holds counts for the totals, its pooled connection made to the old master: the flush
    reaches the new master (written once there), nothing is dropped as a lost answer."""
    limited = policy(limit=100, window=3600)
    assert engine.decide([check(limited, "ip:192.0.2.1")]).allowed
    tally.flush()  # connected to the master, the library loaded
    old, new = sentinel.master, sentinel.replica
    with tally._flushing:  # no flush until the failover is done
        for i in range(5):
            assert engine.decide([check(limited, f"ip:198.51.100.{i}")]).allowed
        wait_replicated(old, new)
        # refused (NOGOODSLAVE) until the sentinel has seen the replica in sync
        wait_for(lambda: sentinel.sentinel.client.execute_command("SENTINEL", "FAILOVER", sentinel.service), 20,
                 "the sentinel to start the failover")
        wait_for(lambda: sentinel.master_port() == new.port and old.client.info("replication")["role"] == "slave",
                 20, "the failover")
    totals = keys.totals_key(limited, 0)
    wait_for(lambda: _allowed(new.client.hgetall(totals)) == 6, 10, "the 5 counts (and the first) on the new master")
