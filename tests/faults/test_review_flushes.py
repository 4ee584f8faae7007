"""Review of the tally's flushes (notes folded into totals, live index and active subjects, written in
one call per shard) and of the in-flight give-back: counts added twice or never, places kept. The
give-back held (see the earlier reviews); the tally's two defects are kept here, and the same
resend found in a cluster's decisions (tests/test_cluster.py)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import redis

from project.devredis import PrivateRedis
from ratelimit_app import engine, live
from ratelimit_app.engine import keys
from ratelimit_app.engine.tally import FLUSH_SECONDS, NOW, RETRY_MOST, Tally, tally
from tests.cluster import wait_for
from tests.helpers import check, policy
from tests.relay import Relay
from tests.servers import ROOT, site_env

pytestmark = pytest.mark.django_db


def _allowed_in_redis(admin: redis.Redis, compiled) -> int:
    """The admitted requests Redis's totals hold, read without this process's flush."""
    fields = admin.hgetall(keys.totals_key(compiled, 0))
    return sum(int(v) for k, v in fields.items() if k[:1] == b"a" and k != b"ac")


def test_a_flush_whose_connection_closes_after_redis_ran_it_is_counted_once(settings, private):
    """Five admitted requests showed as ten in the policy's totals: the flush's script ran, then the
    connection closed before its answer came (a proxy, a CLIENT KILL), and redis-py's pipeline, with the
    retry the README recommends (a broken connection, once), sent it again. A flush is written once."""
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


def test_counts_kept_through_a_short_outage_reach_redis_without_another_request(server):
    """Five requests admitted just before Redis restarted never showed on the live page of another
    worker (nor in its totals) while this worker got no more requests: the failed flush kept them but
    armed no timer; only a later request did. A failed flush is tried again, less often each time."""
    limited = policy(limit=100, window=3600)
    engine.decide([check(policy(), "ip:192.0.2.1")])
    tally.flush()
    with tally._flushing:  # the background flush waits until the server is down: all five are pending
        for i in range(5):
            assert engine.decide([check(limited, f"ip:198.51.100.{i}")]).allowed
        server.stop()
    tally.flush()  # refused: kept for later
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


def test_a_flush_that_cannot_reach_redis_is_tried_again_less_often_each_time(server):
    """The retry of a failed flush waits twice as long each time, up to RETRY_MOST seconds (a dead Redis is
    not asked four times a second by every worker), and a flush that reaches Redis starts it over."""
    own = Tally()  # one of the test's own: no request's timer flushes it meanwhile
    own._pending.counts[(policy(limit=100, window=3600), 0, "a", NOW)] = 1
    server.stop()

    def failed_flush() -> float:
        own.flush()
        armed, own._flusher = own._flusher, None
        armed.cancel()
        return armed.interval

    assert [failed_flush() for _ in range(7)] == [FLUSH_SECONDS * 2**k for k in range(5)] + [RETRY_MOST] * 2
    assert own._pending
    back = PrivateRedis(port=server.port).start()
    try:
        own.flush()
        assert not own._pending
        assert own._retry_in == FLUSH_SECONDS  # the next failure waits FLUSH_SECONDS again
    finally:
        back.stop()


EXITING = """
import sys, django
django.setup()
from ratelimit_app import engine
from ratelimit_app.engine.tally import tally
from tests.helpers import check, policy
with tally._flushing:  # nothing flushed before the exit: the counts wait
    assert engine.decide([check(policy(limit=100, window=3600))]).allowed
    tally._flusher.cancel()
print("counted", flush=True)
sys.stdin.readline()
"""


def test_a_worker_that_exits_while_redis_is_down_says_its_counts_are_lost_without_a_traceback(server, tmp_path):
    """A worker's last flush (at exit) that cannot reach Redis kept its counts for a retry timer that never
    runs: the log said they would reach Redis later, and Python 3.12 refuses to start the timer's
    thread at exit (a RuntimeError traceback). The last flush says the counts are lost, and arms nothing."""
    child = subprocess.Popen([sys.executable, "-c", EXITING], cwd=ROOT, env=site_env(tmp_path / "db.sqlite3",
                             REDIS_URL=server.url), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "counted"
        server.stop()
        _, errors = child.communicate("exit\n", timeout=60)
    finally:
        child.kill()
    assert "totals are lost: the process exits" in errors, errors
    assert "could not reach Redis yet" not in errors and "Traceback" not in errors, errors


def test_a_flush_refused_by_a_replica_is_kept_and_reaches_redis_once_it_is_a_master_again(server, caplog):
    """The address now leads to a replica (a failover the address has not followed yet): Redis refuses the
    flush (READONLY), which ran nothing. The counts are kept, not dropped as possibly sent; once the
    server takes writes again, the next flush brings them, once."""
    limited = policy(limit=100, window=3600)
    assert engine.decide([check(limited, "ip:192.0.2.1")]).allowed
    tally.flush()
    admin = redis.Redis(port=server.port)
    own = Tally()
    own._pending.counts[(limited, 0, "a", NOW)] = 5
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a replica now (of nothing that answers)
    try:
        own.flush()
        if own._flusher is not None:
            own._flusher.cancel()  # kept for a retry: the test flushes once the server is a master again
            own._flusher = None
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
    assert "may not have reached" not in caplog.text
    own.flush()
    assert _allowed_in_redis(admin, limited) == 6  # the decision's own one, and these five once
    admin.close()
