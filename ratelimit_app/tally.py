"""Counts that reach the policies' totals from the workers rather than from the decision itself.

A decision does not touch the policy's totals in Redis (that would be one more command on every
request); the engine adds what it admitted and refused here instead, under the totals bucket of the
decision's own time, and the refusals of the local deny cache join them. A background thread adds
what is pending to Redis at most FLUSH_SECONDS later (lua/tally.lua), in one call per shard; a
reader in this process flushes first, so what it shows is complete. The totals of other processes
are at most FLUSH_SECONDS behind; a process that exits flushes what it holds.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Iterable

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from . import keys
from .connection import client, is_cluster
from .scripts import HEARTBEAT_EVERY, heartbeat, run_each, scripts

if TYPE_CHECKING:
    from .values import CompiledPolicy

logger = logging.getLogger("ratelimit_app")
FLUSH_SECONDS = 0.25
NOW = -1  # a bucket number meaning "the bucket of the flush's own time" (the deny cache knows no Redis time)


class Tally:
    def __init__(self) -> None:
        # pending counts by (policy, shard, series: 'a' allowed / 'd' refused, totals bucket number)
        self._pending: Counter[tuple[CompiledPolicy, int, str, int]] = Counter()
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # a reader's flush waits for the one under way, then sees its counts
        self._flusher: threading.Timer | None = None
        self._heartbeat_due = 0.0  # monotonic time of the next word that this worker runs its library

    def add(self, counts: Iterable[tuple[CompiledPolicy, int, str, int]]) -> None:
        """One more request for each (policy, shard, series, totals bucket number or NOW)."""
        with self._lock:
            pending = self._pending
            for count in counts:  # rather than Counter.update, whose checks cost more than this loop
                pending[count] = pending.get(count, 0) + 1
            if self._flusher is None:
                self._flusher = threading.Timer(FLUSH_SECONDS, self.flush)
                self._flusher.daemon = True
                self._flusher.start()

    def flush(self) -> None:
        """Add what is pending to the policies' totals in Redis (kept for later if Redis cannot be reached)."""
        with self._flushing:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending, self._flusher = self._pending, Counter(), None
        if not pending:
            return
        by_shard: dict[int, tuple[list[str], list[str | int]]] = {}  # one call per shard: one cluster slot each
        counts_of: dict[int, Counter] = {}
        for count, amount in pending.items():
            policy, shard, series, bucket = count
            totals, args = by_shard.setdefault(shard, ([], [""]))
            totals.append(keys.totals_key(policy, shard))
            args += (series, "" if bucket == NOW else bucket, amount, policy.window_ms, policy.totals_bucket_ms)
            counts_of.setdefault(shard, Counter())[count] = amount
        try:
            servers = _servers(client(), by_shard)  # a cluster client connects as it is created: inside the try
        except (redis.RedisError, RedisClusterException) as error:
            self._put_back(pending, error)
            return
        self._heartbeat()
        for server, shards in servers:
            try:
                _reachable(server)
            except redis.RedisError as error:  # nothing was sent: these counts wait for the next flush
                self._put_back(sum((counts_of[shard] for shard in shards), Counter()), error)
                continue
            try:
                run_each(server, scripts.get("tally", server), [by_shard[shard] for shard in shards])
            except redis.RedisError as error:
                # Sent: the server may have run the script and only its answer is lost (a timeout).
                # Never sent again: a few counts missing from a monitoring total beat counting them twice.
                logger.warning("ratelimit: counts for the policies' totals may not have reached Redis: %s", error)

    def _heartbeat(self) -> None:
        """Every HEARTBEAT_EVERY seconds of use, say that this worker runs its library (so that a prune
        keeps it): from the flusher's thread, never on a request's way."""
        if time.monotonic() < self._heartbeat_due:
            return
        self._heartbeat_due = time.monotonic() + HEARTBEAT_EVERY
        try:
            heartbeat(client())
        except (redis.RedisError, RedisClusterException) as error:
            logger.warning("ratelimit: could not say which library this worker runs: %s", error)

    def _put_back(self, counts: Counter, error: BaseException) -> None:
        logger.warning("ratelimit: counts for the policies' totals could not reach Redis yet: %s", error)
        with self._lock:
            self._pending.update(counts)

    def discard(self) -> None:
        """Forget what is pending, once a flush under way has ended (tests: what one test counted must
        not reach the next one's Redis)."""
        with self._flushing, self._lock:
            self._pending.clear()

    def _forked(self) -> None:
        # a forked child has no flusher thread and must not add its parent's counts a second time
        self._pending, self._lock, self._flushing, self._flusher = Counter(), threading.Lock(), threading.Lock(), None
        self._heartbeat_due = 0.0

    def _multiprocessing_child(self) -> None:
        # a multiprocessing child ends with os._exit, past atexit: its own exit hook flushes
        multiprocessing.util.Finalize(None, self.flush, exitpriority=10)


def _servers(redis_client: redis.Redis | RedisCluster, by_shard: dict) -> list[tuple[redis.Redis, list[int]]]:
    """The servers the shards' calls go to, each with its shards: one on a single server, on a cluster
    each master with its own client (whose pipeline, unlike the cluster's, never sends a call twice)."""
    if not is_cluster(redis_client):
        return [(redis_client, list(by_shard))]
    servers: dict[str, tuple[redis.Redis, list[int]]] = {}
    for shard, (totals, _args) in by_shard.items():
        node = redis_client.get_node_from_key(totals[0])
        servers.setdefault(node.name, (redis_client.get_redis_connection(node), []))[1].append(shard)
    return list(servers.values())


def _reachable(server: redis.Redis) -> None:
    """Take a connection from the server's pool (connecting it if need be) and give it back, for the
    pipeline that follows (the pool hands out the last one given back): raises, before anything is
    sent, when the server cannot be reached."""
    pool = server.connection_pool
    pool.release(pool.get_connection())


tally = Tally()
atexit.register(tally.flush)
os.register_at_fork(after_in_child=tally._forked)
multiprocessing.util.register_after_fork(tally, Tally._multiprocessing_child)
