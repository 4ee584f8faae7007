"""The request path's one connection per deciding thread, and the send path that uses it: redis-py's
own send and read, without what a client shared by threads adds around them."""

from __future__ import annotations

import os
import select
import threading
import time
import weakref

import redis
from redis.cluster import RedisCluster
from redis.exceptions import MaxConnectionsError

from ..lru import BoundedCache
from .circuit import PoolFull, ReplyLost, breaker, describe
from .clients import DEFAULT_POOL_WAIT, WRITE_ATTEMPTS, client, is_cluster, packed_size, read_reply, socket_of


class _Pinned(threading.local):
    generation = -1  # the _generation the client was made in
    client: redis.Redis | RedisCluster | None = None


_pinned = _Pinned()
# commands the decisions sent, as redis-py packed them: a subject's repeat request sends the same command.
# One for every thread, within its share of RATELIMIT_CACHE_BYTES (taken anew with the kept connections)
packed = BoundedCache("ratelimit_app.engine.decision_connection.packed", packed_size)
_packed_get = packed.get
UNREAD = "_ratelimit_unread"  # on a kept connection: (its socket, replies of give-backs not read yet, their places)
# on a kept connection: settled usage its next write carries (packed commands, how many, their items): giveback.py
OUTBOX = "_ratelimit_outbox"
ALL_READ = (None, 0, ())
WATCH = "_ratelimit_watch"  # on a connection: (its socket, a poller of it, or None where one cannot tell)
_generation = 0  # moves on when the cache settings change, after an outage or a failover (see unpin)


def decision_client() -> redis.Redis | RedisCluster:
    """client(), keeping one pooled connection for this thread while at most half the pool is kept
    so (taking and checking a pooled connection per call costs the request path; bench/RESULTS.md).
    A cluster client is used as it is; after an outage every thread takes its connection anew."""
    if _pinned.generation == _generation:
        return _pinned.client
    return _pin()


def execute(redis_client: redis.Redis | RedisCluster, *command: object, **options: object) -> object:
    """redis_client.execute_command(*command, **options), written at most once (SentOnce); the
    decision's own command, without options, as redis-py packed it the time before and unparsed (a
    FCALL reply has no parser). A cluster client: as is."""
    kept = getattr(redis_client, "connection", None)
    if kept is not None:  # the thread's kept connection (a cluster client keeps none): every decision but few
        return _once(redis_client, kept, command, options, bool(options))
    if is_cluster(redis_client):
        return redis_client.execute_command(*command, **options)
    return _sent_once(redis_client, command, options, parse=bool(options))


class SentOnce(redis.Redis):
    """The request path's client, on the cache's pool: every command written once, on a connection
    checked just before writing. A command whose reply was lost may have run (a decision counted):
    no retry policy sends it again. A connection Redis closed while it rested (idle timeout, CLIENT
    KILL, restart) is replaced before writing, so that costs nothing."""

    def execute_command(self, *args: object, **options: object) -> object:
        return _sent_once(self, args, options, parse=True)

    def close(self) -> None:
        """The kept connection goes back to the pool (its thread ended): closed if give-backs' replies
        are still to come on it, which its next user would read as its own (Redis runs what it got)."""
        kept = getattr(self, "connection", None)
        if kept is not None and getattr(kept, UNREAD, ALL_READ)[1]:
            if socket_of(kept) is not None:
                read_unread(kept)  # those come: with nothing unread, the close is an orderly one Redis reads to the end
            if getattr(kept, UNREAD, ALL_READ)[1]:
                kept.disconnect()
                setattr(kept, UNREAD, ALL_READ)  # its pool's next user of it has none due
        super().close()


def _sent_once(redis_client: redis.Redis, command: tuple, options: dict, parse: bool) -> object:
    kept = getattr(redis_client, "connection", None)
    if kept is not None:
        return _once(redis_client, kept, command, options, parse)
    pool = redis_client.connection_pool
    connection = _borrow(pool)
    try:
        return _once(redis_client, connection, command, options, parse)
    finally:
        pool.release(connection)
        with _returned:
            _returned.notify()


def _once(
    redis_client: redis.Redis, connection: redis.Connection, command: tuple, options: dict, parse: bool
) -> object:
    """The round trip, on a live connection; after the command is written, no second try."""
    unread = getattr(connection, UNREAD, ALL_READ)[1]
    if unread:
        # those come read; those lost are owed: Redis closed the connection (its end of file), or it was
        # reconnected since (its thread closed it back to the pool, and this call borrowed it)
        read_unread(connection)
        unread = getattr(connection, UNREAD, ALL_READ)[1]
    if not unread:  # a connection with replies still due is in use, not resting: readable is not closed
        replace_if_closed(connection)
    # a subject's repeat request sends the same command as before: packed once, then sent as it was
    message = _packed_get(command) if not options else connection.pack_command(*command)
    if message is None:
        message = packed.put(command, connection.pack_command(*command))
    carried = connection.__dict__.pop(OUTBOX, None)  # settled usage waiting for this write (giveback.py)
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            if carried is None:
                connection.send_packed_command(message, check_health=False)  # connects first when need be
            else:
                connection.send_packed_command([*carried[0], *message], check_health=False)
                unread = _carrying(connection, carried)
            break
        except redis.ConnectionError:
            # nothing reached Redis whole (a failed write leaves at most part of a command, which Redis
            # never runs): safe to send anew. A refused connection fails again at once: an outage
            connection.disconnect()
            if carried is not None:  # written before the command, it may have reached Redis whole: not twice
                replies_lost(carried[2])
                carried = None
            if unread:  # the give-backs' replies went with it: owed, sent again
                read_unread(connection)
                unread = 0
            if attempt == WRITE_ATTEMPTS:
                raise
    try:
        if unread:  # Redis answers in order: the give-backs' replies come first
            read_unread(connection, wait=True)
        if parse:
            return redis_client.parse_response(connection, command[0], **options)
        return read_reply(connection)
    except redis.ConnectionError as error:  # not a timeout (Redis not answering in time is an outage)
        connection.disconnect()
        # Redis (or a proxy) closed the connection with the command in it: it may have run
        raise ReplyLost(f"the connection closed before Redis answered ({describe(error)}); the call may have "
                        "counted, and is not sent again") from error


def _carrying(connection: redis.Connection, carried: tuple) -> int:
    """The settled usage written before the command: its replies come first, read as the give-backs' are."""
    sock, due, owing = getattr(connection, UNREAD, ALL_READ)
    due += carried[1]
    setattr(connection, UNREAD, (socket_of(connection), due, [*owing, *carried[2]]))
    return due


def read_unread(kept: redis.Connection, wait: bool = False) -> None:
    """Read the replies of the give-backs written on `kept` without waiting: those that have arrived, or
    with `wait` all of them (the connection's next command is written: they come before its own). Those
    the connection lost (closed or reconnected since) are handed to `replies_lost`, to be sent again (a
    give-back runs twice harmlessly); a wait that failed raises, as the command's own read would."""
    sock, count, held = getattr(kept, UNREAD, ALL_READ)
    try:
        while count:
            if sock is not socket_of(kept):
                raise redis.ConnectionError("reconnected with give-backs' replies due")
            if not wait and not kept.can_read(timeout=0):
                break  # not answered yet: read after the next command is written, never waited for here
            try:
                kept.read_response()
            except redis.ResponseError:
                pass  # nothing to do about a give-back that failed: its lease runs out
            count -= 1
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        setattr(kept, UNREAD, ALL_READ)
        kept.disconnect()
        replies_lost(held)
        if wait:
            raise
        return
    setattr(kept, UNREAD, (sock, count, held) if count else ALL_READ)


def replies_lost(held: list) -> None:
    """Set by giveback: what to do with give-backs whose replies a connection lost (owe them)."""


def replace_if_closed(connection: redis.Connection) -> None:
    """Whether Redis closed this connection while it rested shows as a readable socket: its end of file
    (or an unsolicited reply). Then a new connection carries the command."""
    sock = socket_of(connection)
    if sock is None:
        return  # not connected: send_packed_command connects
    watch = getattr(connection, WATCH, None)
    if watch is None or watch[0] is not sock:
        watch = (sock, _poller(sock))
        setattr(connection, WATCH, watch)
    try:
        # a resting connection has every reply it asked for read: nothing waits in its parser
        stale = bool(watch[1].poll(0)) if watch[1] else connection.can_read(timeout=0)
    except (redis.ConnectionError, OSError):
        stale = True
    if stale:
        connection.disconnect()


def _poller(sock) -> select.poll | None:
    """A poller kept with the socket: redis-py's can_read makes one per call, a cost on every decision.
    None for TLS, whose decrypted bytes a poll cannot see (can_read asks the socket), or without poll()."""
    if hasattr(sock, "pending") or not hasattr(select, "poll"):
        return None
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return poller


# a decision's connection given back to the pool: a thread waiting for one (the pool was full) tries again
_returned = threading.Condition()
POOL_WAIT_STEP = 0.01  # seconds between tries when the connection freed went to another user of the pool


def _borrow(pool: redis.ConnectionPool, wait: bool = True) -> redis.Connection:
    """A connection of the pool, opened anew if Redis closed it while it opened (nothing written yet).
    A full pool (max_connections in use) is the site's own back-pressure, not an outage: wait for a
    connection, as long as the socket timeout allows a reply to take (unless `wait` is false)."""
    deadline, attempts = None, 0
    while True:
        try:
            return pool.get_connection()  # connects it, or checks the one it had: nothing written yet
        except redis.ConnectionError as error:
            if not _pool_full(pool, error):
                attempts += 1
                if attempts == WRITE_ATTEMPTS:
                    raise
                continue
            now = time.monotonic()
            deadline = deadline or now + (pool.connection_kwargs.get("socket_timeout") or DEFAULT_POOL_WAIT)
            if now >= deadline or not wait:
                raise PoolFull(f"every one of the {pool.max_connections} connections of the pool stayed in use "
                               "while a decision waited") from error
        with _returned:
            _returned.wait(min(POOL_WAIT_STEP, deadline - now))


def _pool_full(pool: redis.ConnectionPool, error: redis.ConnectionError) -> bool:
    if isinstance(error, MaxConnectionsError):
        return True
    # a BlockingConnectionPool waited its own timeout for a connection, and says so only in words
    return isinstance(pool, redis.BlockingConnectionPool) and str(error) == "No connection available."


# the clients keeping a connection, by pool: a client leaves when its thread ends
_kept: weakref.WeakKeyDictionary[object, weakref.WeakSet] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


def _pin() -> redis.Redis | RedisCluster:
    shared = client()
    pool = getattr(shared, "connection_pool", None)
    _drop_pinned()
    kept = shared
    if pool is not None and not is_cluster(shared):
        kept = SentOnce(connection_pool=pool)  # a connection borrowed per call
        with _kept_lock:  # one thread at a time: the count of kept connections stays exact
            keeping = _kept.setdefault(pool, weakref.WeakSet())
            if len(keeping) < pool.max_connections // 2:
                # connects, opened anew if Redis closed it meanwhile: an outage raises here, inside the breaker
                try:
                    connection = _borrow(pool, wait=False)
                except PoolFull:
                    pass  # the site's other uses of the pool hold the rest
                else:
                    kept = SentOnce(connection_pool=pool)
                    kept.connection = connection  # the thread's own, until close() gives it back
                    keeping.add(kept)
    _pinned.client, _pinned.generation = kept, _generation
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
    packed.clear()  # the next connections may pack otherwise (the cache settings changed)


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
