"""The request path's one connection per deciding thread, and the send path that uses it: redis-py's
own send and read, without what a client shared by threads adds around them."""

from __future__ import annotations

import os
import threading
import weakref

import redis
from redis.cluster import RedisCluster

from .breaker import breaker
from .connection import client, is_cluster


class _Pinned(threading.local):
    generation = -1  # the _generation the client was made in
    client: redis.Redis | RedisCluster | None = None
    packed: dict = {}  # commands sent through the kept connection, as redis-py packed them (each _pin makes its own)


# packed commands a thread keeps (a subject's repeat requests send the same command): as many as a
# policy keeps script parts for (engine.MAX_PARTS), so a site with thousands of active subjects still
# finds them, not one packing per request; at most about 2.5 MB a thread
MAX_PACKED = 4096


_pinned = _Pinned()
_generation = 0  # moves on when the cache settings change, after an outage or a failover (see unpin)


def decision_client() -> redis.Redis | RedisCluster:
    """client(), keeping one pooled connection for this thread while at most half the pool is kept
    so (taking and checking a pooled connection per call costs the request path; bench/RESULTS.md).
    A cluster client is used as it is; after an outage every thread takes its connection anew."""
    if _pinned.generation == _generation:
        return _pinned.client
    return _pin()


def execute(redis_client: redis.Redis | RedisCluster, *command: object, **options: object) -> object:
    """redis_client.execute_command(*command, **options); on a kept connection, redis-py's own send
    and read under the connection's retry policy, without what a client shared by threads adds
    around every command (a lock, hooks). Any other client, or a command with options: as is."""
    kept = getattr(redis_client, "connection", None)
    if kept is None or options:
        return redis_client.execute_command(*command, **options)
    return kept.retry.call_with_retry(lambda: _on_live_connection(kept, command), lambda _error: kept.disconnect())


def _on_live_connection(kept: redis.Connection, command: tuple) -> object:
    """The round trip, on a new connection if Redis or a proxy closed the one kept (idle timeout,
    CLIENT KILL, restart): the pool checks a connection before lending it, we learn it on use."""
    if kept._sock is None:  # not connected yet, or dropped after a failure: no stale socket to replace
        return _round_trip(kept, command)
    try:
        return _round_trip(kept, command)
    except redis.ConnectionError:
        kept.disconnect()
        return _round_trip(kept, command)


def _round_trip(kept: redis.Connection, command: tuple) -> object:
    # a subject's repeat request sends the same command as before: packed once, then sent as it was
    packed = _pinned.packed
    if len(packed) >= MAX_PACKED:
        packed.clear()
    message = packed.get(command)
    if message is None:
        message = packed[command] = kept.pack_command(*command)
    kept.send_packed_command(message)
    return kept.read_response()


# the clients keeping a connection, by pool: a client leaves when its thread ends
_kept: weakref.WeakKeyDictionary[object, weakref.WeakSet] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


def _pin() -> redis.Redis | RedisCluster:
    shared = client()
    pool = getattr(shared, "connection_pool", None)
    _drop_pinned()
    kept = shared
    if pool is not None and not is_cluster(shared):
        with _kept_lock:  # one thread at a time: the count of kept connections stays exact
            keeping = _kept.setdefault(pool, weakref.WeakSet())
            if len(keeping) < pool.max_connections // 2:
                # takes a connection from the pool and connects: an outage raises here, inside the breaker
                kept = redis.Redis(connection_pool=pool, single_connection_client=True)
                keeping.add(kept)
    _pinned.client, _pinned.generation, _pinned.packed = kept, _generation, {}
    return kept


def _drop_pinned() -> None:
    """Give this thread's kept connection back, closed: after a failover it may point at a replica."""
    old, _pinned.client = _pinned.client, None
    connection = getattr(old, "connection", None)
    if connection is not None:
        connection.disconnect()
        old.close()


def unpin() -> None:
    """Every thread takes its kept connection from the pool again at its next decision: the cache
    settings changed, Redis did not answer (the pool finds the server anew, a Sentinel's new master
    included), or a failover turned the server the kept connections reach into a replica."""
    global _generation
    _generation += 1


def _forked() -> None:
    # a forked child must not share its parent's socket: it makes its own at its first decision
    _pinned.__dict__.clear()


os.register_at_fork(after_in_child=_forked)


def _taken_anew(error: redis.RedisError) -> None:
    if isinstance(error, redis.ReadOnlyError):
        # pooled connections still point at the old primary, while a new connection to the same
        # address may reach the new one (a cluster client has no single pool: it follows failovers)
        pool = getattr(client(), "connection_pool", None)
        if pool is not None:
            pool.disconnect(inuse_connections=False)
    unpin()  # each thread's kept connection, at its next call


breaker.reconnect = _taken_anew
