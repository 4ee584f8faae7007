"""The asyncio clients of decisions: one per running event loop, closed with it, built from the pool
django-redis made for the sync client, each command written once."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine
from typing import NoReturn

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ..conf import get_setting
from ..lru import BoundedCache
from .circuit import PoolFull, ReplyLost, describe
from .clients import (
    DEFAULT_POOL_WAIT,
    WRITE_ATTEMPTS,
    aread_reply,
    client,
    hiredis_of,
    packed_size,
    retry_parts,
    unread,
    writer_of,
)

# the commands whose packing a client keeps: the decisions' own, whose arguments are text and counts (a
# command with a float equal to an int, 1.0 and 1, would otherwise find the other's packing)
PACKED_KEPT = frozenset({"FCALL", "EVALSHA"})
# the decisions as packed before (decision_connection's own), for every loop's client, within their share of
# RATELIMIT_CACHE_BYTES
packed = BoundedCache("ratelimit_app.engine.aclients.packed", packed_size)

# asyncio connections belong to the event loop that opened them: one client per running loop, closed
# with it. An async view under a WSGI server runs in a new loop per request: kept past their loops,
# the clients would hold a socket each, for ever.
_async_clients: dict[asyncio.AbstractEventLoop, tuple[redis.asyncio.Redis, object]] = {}
_async_lock = threading.Lock()


def aclient() -> redis.asyncio.Redis:
    """An asyncio client for the running loop, to the server the sync client reaches, logged in the same way."""
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is None:
        return _new_aclient(loop)
    return found[0]


def _new_aclient(loop: asyncio.AbstractEventLoop) -> redis.asyncio.Redis:
    options = settings.CACHES[get_setting("RATELIMIT_CACHE")].get("OPTIONS", {})
    made = async_twin(client(), options.get("REDIS_CLIENT_KWARGS", {}))
    closer = _closed_with_loop(loop, made)
    with _async_lock:
        for old in [old for old in _async_clients if old.is_closed()]:
            # closed without shutting its async generators down: the collector closes their sockets
            del _async_clients[old]
        _async_clients[loop] = (made, closer)
    return made


async def _close_at_shutdown(loop: asyncio.AbstractEventLoop, made: redis.asyncio.Redis):
    try:
        yield
    finally:  # the loop shuts its async generators down (asyncio.run, asgiref, uvicorn), or this one was forgotten
        with _async_lock:
            if _async_clients.get(loop, (None,))[0] is made:
                del _async_clients[loop]
        await made.aclose(close_connection_pool=True)


def _closed_with_loop(loop: asyncio.AbstractEventLoop, made: redis.asyncio.Redis) -> object:
    """An async generator, started in `loop`, whose end closes `made`: the loop keeps such generators
    (weakly) and closes them as it shuts down. Kept beside the client, so that it lives as long."""
    closer = _close_at_shutdown(loop, made)
    try:
        closer.asend(None).send(None)  # to its first yield, which awaits nothing; the loop now knows it
    except StopIteration:
        pass
    return closer


_ASYNC_CONNECTIONS = {
    redis.Connection: redis.asyncio.Connection,
    redis.SSLConnection: redis.asyncio.SSLConnection,
    redis.UnixDomainSocketConnection: redis.asyncio.UnixDomainSocketConnection,
}


def async_twin(shared: redis.Redis, client_kwargs: dict) -> redis.asyncio.Redis:
    """An asyncio client built from the pool django-redis made for `shared`, so that whatever the cache
    accepts (Sentinel, USERNAME, SSL, CONNECTION_POOL_KWARGS, REDIS_CLIENT_KWARGS) holds for both."""
    pool = shared.connection_pool
    client_kwargs = _accepted(redis.asyncio.Redis, client_kwargs)
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        manager = pool.sentinel_manager
        addresses = [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
                     for s in manager.sentinels]
        sentinel_kwargs = _async_connection_kwargs(redis.asyncio.Connection, manager.sentinel_kwargs)
        connection_kwargs = _async_connection_kwargs(redis.asyncio.sentinel.SentinelManagedConnection,
                                                     pool.connection_kwargs)
        found = redis.asyncio.sentinel.Sentinel(
            addresses, manager.min_other_sentinels, sentinel_kwargs, **connection_kwargs
        )
        pick = found.master_for if pool.is_master else found.slave_for
        return pick(pool.service_name, redis_class=SentOnce, max_connections=pool.max_connections, **client_kwargs)
    connection_class = _ASYNC_CONNECTIONS.get(pool.connection_class)
    if connection_class is None:
        raise ImproperlyConfigured(f"ratelimit_app has no asyncio counterpart of {pool.connection_class.__name__}")
    connection_kwargs = _async_connection_kwargs(connection_class, pool.connection_kwargs)
    # a full pool is waited for (up to the socket timeout), as on the sync path
    async_pool = redis.asyncio.BlockingConnectionPool(
        connection_class=connection_class, max_connections=pool.max_connections,
        timeout=connection_kwargs.get("socket_timeout") or DEFAULT_POOL_WAIT, **connection_kwargs,
    )
    return SentOnce(connection_pool=async_pool, **client_kwargs)


class SentOnce(redis.asyncio.Redis):
    """The asyncio client of decisions: each command written once, on a connection the pool found
    open, never again by a retry policy (a reply lost with its connection may have counted).

    A connection whose reply was read is kept for the loop's next command rather than given back to
    the pool, unless a command waits for the pool: redis-py's checkout (a lock, a timeout, its metrics
    hooks) cost a decision about 40 us. Kept connections stay checked out of the pool."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.kept: list[redis.asyncio.Connection] = []
        self.waiting = 0  # commands waiting for the pool: a connection read to the end goes to them
        self.deadlines: Deadlines | None = None  # its reads' socket timeouts, in the loop it serves

    async def execute_command(self, *args: object, **options: object) -> object:
        if options:
            return await super().execute_command(*args, **options)
        # take(), the write and keep() each a coroutine no more, for a kept connection at rest (most decisions)
        resting = self._resting()
        connection, hiredis = resting if resting is not None else (await self.take(), None)
        try:
            message = self._packed(connection, args)
            writing = write(connection, message)
            if writing is not None:
                await self._written(connection, message, writing)
                hiredis = None
            if hiredis is None:  # not the resting connection's, or connected by now: the write connects
                hiredis = hiredis_of(connection)
            try:
                if hiredis is None:
                    reply = await connection.read_response()  # under the socket timeout
                else:
                    reply = await aread_reply(connection, hiredis, self.deadlines or self._deadlines())
            except redis.ConnectionError as error:
                raise ReplyLost(f"the connection closed before Redis answered ({describe(error)}); the call may "
                                "have counted, and is not sent again") from error
        except BaseException:  # cancelled or failed with a reply unread
            await self.discard(connection)
            raise
        if self.waiting:
            await self.to_pool(connection)
        else:
            self.kept.append(connection)
        if args[0] in PACKED_KEPT:  # a decision's reply (FCALL, EVALSHA) has no parser
            return reply
        parse = self.response_callbacks.get(args[0])
        if parse is None:
            return reply
        reply = parse(reply)
        return await reply if inspect.isawaitable(reply) else reply

    def _resting(self) -> tuple[redis.asyncio.Connection, tuple] | None:
        """take() without awaiting: the last connection kept and its hiredis_of() parts, when it is connected
        with nothing unread (hiredis tells at once); None otherwise, and take() checks or replaces it."""
        kept = self.kept
        if not kept:
            return None
        connection = kept[-1]
        hiredis = hiredis_of(connection) if connection.is_connected else None
        if hiredis is None or unread(hiredis):
            return None
        return kept.pop(), hiredis

    async def take(self) -> redis.asyncio.Connection:
        """A connection with nothing unread and not closed by Redis: one kept from an earlier command,
        else the pool's. One closed (its end of file read by the loop) is opened anew by its next write."""
        connection = self.kept.pop() if self.kept else await self._checkout()
        if not connection.is_connected:
            return connection
        try:
            # the pool does not always check (not with RESP3's maintenance notifications), nor does keep():
            # a give-back written to a kept connection Redis closed while at rest would be lost, then owed
            hiredis = hiredis_of(connection)
            if unread(hiredis) if hiredis is not None else await connection.can_read():
                await connection.disconnect(nowait=True)
        except redis.ConnectionError:
            pass  # can_read disconnected it
        except BaseException:
            await self.discard(connection)
            raise
        return connection

    async def _checkout(self) -> redis.asyncio.Connection:
        pool, attempt = self.connection_pool, 1
        while True:
            self.waiting += 1
            try:
                return await pool.get_connection()  # connects when need be: nothing written yet
            except redis.ConnectionError as error:
                if isinstance(pool, redis.asyncio.BlockingConnectionPool) and str(error) == "No connection available.":
                    raise PoolFull(
                        f"every one of the {pool.max_connections} connections of the pool stayed in use"
                    ) from error
                if attempt == WRITE_ATTEMPTS:
                    raise
                attempt += 1
            finally:
                self.waiting -= 1

    async def keep(self, connection: redis.asyncio.Connection) -> None:
        """Take back a connection from take() whose replies were all read."""
        if self.waiting:
            await self.to_pool(connection)
        else:
            self.kept.append(connection)

    async def discard(self, connection: redis.asyncio.Connection) -> None:
        """Close a connection that may hold a reply unread, and give it back to the pool."""
        await connection.disconnect(nowait=True)
        await self.to_pool(connection)

    async def to_pool(self, connection: redis.asyncio.Connection) -> None:
        """Give `connection` back to the pool, even if the caller is cancelled while the pool's lock is
        busy: lost there, it would stay checked out for ever (a pool of one then refuses every command)."""
        await asyncio.shield(self.connection_pool.release(connection))

    async def _written(self, connection: redis.asyncio.Connection, message: list[bytes], writing) -> None:
        """Finish a write() that must wait (connecting, or the transport holding data back); one that failed
        with nothing of it reaching Redis whole is sent anew."""
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                await writing
                return
            except redis.ConnectionError:  # nothing reached Redis whole: safe to send anew
                await connection.disconnect()
                if attempt == WRITE_ATTEMPTS:
                    raise
            writing = write(connection, message)
            if writing is None:
                return

    def _deadlines(self) -> Deadlines:
        self.deadlines = Deadlines(asyncio.get_running_loop())
        return self.deadlines

    def _packed(self, connection: redis.asyncio.Connection, args: tuple) -> list[bytes]:
        # a subject's repeat request sends the same command as before: packed once, then sent as it was
        if args[0] not in PACKED_KEPT:
            return connection.pack_command(*args)
        message = packed.get(args)
        if message is None:
            message = connection.pack_command(*args)
            if len(message) == 1:  # a large command (over redis-py's buffer cutoff) is not kept
                packed.put(args, message)
        return message


class Deadlines:
    """The socket timeout of the reads under way in one loop: each read's deadline, checked by one timer
    armed for the earliest, where asyncio.timeout() arms and cancels a timer (and a Timeout) per read. A
    read past its deadline is woken with TimeoutError, as its waiter's exception (clients.DirectReplies)."""

    __slots__ = ("loop", "reads", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reads: dict[asyncio.Future, float] = {}
        self.timer: asyncio.TimerHandle | None = None

    def start(self, waiter: asyncio.Future, timeout: float) -> None:
        """A read waits for `waiter` from now, for `timeout` seconds at most. A timer armed already expires
        first: reads start later with the same timeout."""
        self.reads[waiter] = deadline = self.loop.time() + timeout
        if self.timer is None:
            self.timer = self.loop.call_at(deadline, self._expire)

    def end(self, waiter: asyncio.Future) -> None:
        self.reads.pop(waiter, None)

    def _expire(self) -> None:
        now = self.loop.time()
        reads = self.reads
        for waiter in [waiter for waiter, deadline in reads.items() if deadline <= now]:
            del reads[waiter]
            if not waiter.done():  # the read waiting on it raises it; its connection is closed
                waiter.set_exception(TimeoutError())
        self.timer = self.loop.call_at(min(reads.values()), self._expire) if reads else None


def write(connection: redis.asyncio.Connection, message: list[bytes]) -> Coroutine | None:
    """connection.send_packed_command(message, check_health=False) without the task and timer it makes
    per write (asyncio.wait_for): None when the message went to the transport whole, which a decision
    fits, else the coroutine to await that ends the write: connecting first, waiting under the socket
    timeout while the transport holds data back (Redis stalled, or the connection lost), or failing."""
    if not connection.is_connected:
        return connection.send_packed_command(message, check_health=False)  # connects first
    writer = writer_of(connection)
    transport = writer.transport
    if transport.is_closing():  # the loop closed it (a reset read meanwhile): Python 3.13 fails the write
        return _failed(connection, redis.ConnectionError("Error while writing to socket: the connection was closed"))
    try:
        if len(message) == 1:
            transport.write(message[0])
        else:
            writer.writelines(message)
    except BaseException as error:  # noqa: BLE001 - raised by the coroutine, as the write's own failure
        return _drained(connection, writer, error)
    if transport.get_write_buffer_size() or transport.is_closing():
        return _drained(connection, writer)  # drain() raises for a lost connection, and waits while paused
    return None


async def _failed(connection: redis.asyncio.Connection, error: BaseException) -> NoReturn:
    await connection.disconnect(nowait=True)
    raise error


async def _drained(connection: redis.asyncio.Connection, writer: asyncio.StreamWriter,
                   failed: BaseException | None = None) -> None:
    try:
        if failed is not None:
            raise failed
        if connection.socket_timeout:
            await asyncio.wait_for(writer.drain(), connection.socket_timeout)
        else:
            await writer.drain()
    except TimeoutError:  # wait_for timed out: before OSError, whose subclass it is
        await connection.disconnect(nowait=True)
        raise redis.TimeoutError("Timeout writing to socket") from None
    except OSError as error:
        await connection.disconnect(nowait=True)
        raise redis.ConnectionError(f"Error while writing to socket: {describe(error)}") from error
    except BaseException:  # cancelled with the command maybe part written: the connection cannot be used
        await connection.disconnect(nowait=True)
        raise


def _async_connection_kwargs(connection_class: type, kwargs: dict) -> dict:
    """A sync connection's options for an asyncio one: the same values, but its own parser and retry type."""
    own = ("parser_class", "connection_pool")  # the sync parser; a Sentinel pool's link to itself
    converted = _accepted(connection_class, {name: value for name, value in kwargs.items() if name not in own})
    retry = converted.get("retry")
    if retry is not None and not isinstance(retry, redis.asyncio.retry.Retry):
        converted["retry"] = redis.asyncio.retry.Retry(*retry_parts(retry))
    return converted


def _accepted(cls: type, kwargs: dict) -> dict:
    """The keyword arguments that `cls` (or a base class it passes **kwargs to) takes."""
    names = {name for klass in cls.__mro__ if "__init__" in vars(klass)
             for name in inspect.signature(klass.__init__).parameters}
    return {name: value for name, value in kwargs.items() if name in names}


def forget_aclients() -> None:
    """The cache settings changed: each loop makes its client anew (an old one closes with its loop all the
    same, its generator then collected)."""
    with _async_lock:
        _async_clients.clear()
    packed.clear()  # the next clients may pack otherwise
