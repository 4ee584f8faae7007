"""Review of the tally's flushes (notes folded into totals, live index and active subjects, written in
one call per shard) and of the in-flight give-back: counts added twice or never, places kept. The
give-back held (see the earlier reviews); the two tally defects are recorded here, not fixed yet."""

from __future__ import annotations

import threading

import pytest
import redis

from project.devredis import PrivateRedis
from ratelimit_app import engine, live
from ratelimit_app.engine import keys
from ratelimit_app.engine.tally import FLUSH_SECONDS, tally
from tests.cluster import wait_for
from tests.helpers import check, policy
from tests.relay import Relay

pytestmark = pytest.mark.django_db


def _allowed_in_redis(admin: redis.Redis, compiled) -> int:
    """The admitted requests Redis's totals hold, read without this process's flush."""
    fields = admin.hgetall(keys.totals_key(compiled, 0))
    return sum(int(v) for k, v in fields.items() if k[:1] == b"a" and k != b"ac")


def _flush_timers() -> list:
    return [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.function == tally.flush]


@pytest.mark.xfail(reason=(
    "Found by the tally review, not fixed yet: the flush goes through redis-py's pipeline, which the "
    "connection's retry sends again after a ConnectionError on the read (engine/batches.py run_each); a "
    "flush must be written once, as the give-back's is, and its counts dropped when its answer is lost."))
def test_a_flush_whose_connection_closes_after_redis_ran_it_is_counted_twice(settings, private):
    """Five admitted requests show as ten in the policy's totals: the flush's script ran, then the
    connection closed before its answer came (a proxy, a CLIENT KILL), and redis-py's pipeline, with the
    retry the README recommends (a broken connection, once), sent it again. tally.py says never."""
    with Relay(private.port) as relay:
        options = {**settings.CACHES["default"]["OPTIONS"], "SOCKET_TIMEOUT": 10}
        settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": relay.url,
                                                      "OPTIONS": options}}
        settings.RATELIMIT_CACHE = "own"
        limited = policy(limit=100, window=3600)
        engine.decide([check(policy(), "ip:192.0.2.1")])
        tally.flush()  # connected, the library loaded: the flush below sends only the counts
        admin = redis.Redis(port=private.port)
        with tally._flushing:  # the background flush waits until the answers are held
            for i in range(5):
                assert engine.decide([check(limited, f"ip:198.51.100.{i}")]).allowed
            relay.hold_answers()
        flushing = threading.Thread(target=tally.flush)
        flushing.start()
        try:
            wait_for(lambda: _allowed_in_redis(admin, limited) == 5, 10, "Redis to run the flush")  # its answer is held
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            wait_for(lambda: relay.closed >= 1, 10, "the relay to close")
        finally:
            relay.release_answers()
            flushing.join()
        allowed, _, active, _ = live.policy_totals(limited)
        admin.close()
    assert (allowed, active) == (5, 5), f"{allowed} admitted requests and {active} active subjects for 5 of each"


@pytest.mark.xfail(reason=(
    "Found by the tally review, not fixed yet: a failed flush puts its counts back (Tally._put_back) but "
    "arms no timer, so an idle worker sends them only with its next request; it needs a retry timer with "
    "a backoff, as the give-back's owed places have."))
def test_counts_kept_through_a_short_outage_reach_redis_only_with_the_next_request(server):
    """Five requests admitted just before Redis restarted never show on the live page of another worker
    (nor in its totals) while this worker gets no more requests: the failed flush kept them, but no
    timer is armed again (tally.py:136 drops it, _put_back arms none); only a later note() does."""
    limited = policy(limit=100, window=3600)
    engine.decide([check(policy(), "ip:192.0.2.1")])
    tally.flush()
    with tally._flushing:  # the background flush waits until the server is down: all five are pending
        for i in range(5):
            assert engine.decide([check(limited, f"ip:198.51.100.{i}")]).allowed
        server.stop()
    tally.flush()  # refused: kept for later
    # every flush timer armed so far has run (each failing, keeping the counts): none is left to send them
    wait_for(lambda: not _flush_timers(), 10, "the flush timers to run")
    assert tally._pending
    back = PrivateRedis(port=server.port).start()
    try:
        admin = redis.Redis(port=server.port)
        # another worker reads Redis as it is: this one promised them within FLUSH_SECONDS once it can
        try:
            wait_for(lambda: _allowed_in_redis(admin, limited) == 5, 40 * FLUSH_SECONDS, "the 5 counts in Redis")
        finally:
            admin.close()
    finally:
        back.stop()
