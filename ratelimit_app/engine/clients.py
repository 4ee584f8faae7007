"""The Redis client of RATELIMIT_CACHE shared by the process, Redis Cluster's connection factory, and
what the cache's retry options mean."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from typing import Callable, NoReturn

import redis
from django.conf import settings
from django.core.cache import caches
from django_redis.cache import RedisCache, omit_exception
from django_redis.pool import ConnectionFactory
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

try:  # redis-py's hiredis parsers, read straight (read_reply, hiredis_of); their names are redis-py's own
    from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser, _HiredisParser
except ImportError:  # another redis-py: its read_response() is used
    NOT_ENOUGH_DATA, _HiredisParser, _AsyncHiredisParser = object(), None, None

from ..conf import get_setting
from ..lru import size_of

_client: redis.Redis | RedisCluster | None = None

def client() -> redis.Redis | RedisCluster:
    """The django-redis client of RATELIMIT_CACHE (thread-safe; looked up once, not per request).

    A redis.Redis for one server or Sentinel (django-redis's SentinelConnectionFactory), a
    redis.cluster.RedisCluster when the cache uses ClusterConnectionFactory below.
    """
    global _client
    if _client is None:
        # a backend of the process's own, not caches[alias]: Django keeps one of those per thread and closes
        # each at the end of every request of its thread (request_finished), ~22k instructions a request
        backend = caches.create_connection(get_setting("RATELIMIT_CACHE"))
        try:
            get_client = backend.client.get_client
        except AttributeError:  # as django-redis' get_redis_connection() says it
            raise NotImplementedError("This backend does not support this feature") from None
        _client = _watch_flushes(get_client(True))  # from the process's pool, as every backend of the alias
    return _client


_on_flush: list[Callable[[], None]] = []


def when_flushed(forget: Callable[[], None]) -> None:
    """Call `forget` whenever Redis answers a FLUSHDB or FLUSHALL sent through the app's client, or a
    django-redis cache.clear() (a test's, in any thread): what the process remembers of Redis' data is
    gone with it. A flush from elsewhere shows at the next version check."""
    _on_flush.append(forget)
    _watch_cache_clears()


def _flushed() -> None:
    for forget in _on_flush:
        forget()


def _watch_cache_clears() -> None:
    """cache.clear() of a django-redis cache, in any thread, calls the listeners too: each thread's
    caches[alias] is a backend with a client of its own, which the app's client is not. Only a clear
    Redis ran, of the app's server: what another server or a failed clear empties leaves its refusals true."""
    clear = RedisCache.clear
    if getattr(clear, "watches_flushes", False):
        return
    # django-redis' own clear, inside omit_exception (which may ignore its failure): a failure is seen here
    emptying = getattr(clear, "__wrapped__", clear)

    @functools.wraps(emptying)
    def cleared(self: RedisCache, *args: object, **kwargs: object) -> object:
        done = emptying(self, *args, **kwargs)  # raises when Redis did not answer
        if _on_the_apps_server(self):
            _flushed()
        return done

    watched = cleared if emptying is clear else omit_exception(cleared)
    watched.watches_flushes = True  # type: ignore[attr-defined]
    RedisCache.clear = watched  # type: ignore[method-assign]


def _server_of(redis_client: object) -> tuple | None:
    pool = getattr(redis_client, "connection_pool", None)  # None: a cluster, whose nodes are many
    if pool is None:
        return None
    options = pool.connection_kwargs
    return options.get("host"), options.get("port"), options.get("path"), options.get("db", 0)


def _on_the_apps_server(backend: RedisCache) -> bool:
    """Whether a cleared django-redis cache is the app's server, whatever its alias (unsure: it is)."""
    if _client is None:
        return True
    try:
        theirs = _server_of(backend.client.get_client(write=True))
    except Exception:  # noqa: BLE001 - a client of django-redis without one server (sharded): Redis was emptied
        return True
    mine = _server_of(_client)
    return theirs is None or mine is None or theirs == mine


def _watch_flushes(redis_client: redis.Redis | RedisCluster) -> redis.Redis | RedisCluster:
    callbacks = getattr(redis_client, "response_callbacks", None)
    if callbacks is None:
        return redis_client
    for command in ("FLUSHDB", "FLUSHALL"):
        if getattr(callbacks.get(command), "watches_flushes", False):
            continue  # django-redis hands the same client out again
        parse = callbacks.get(command)

        def flushed(response: object, _parse: Callable | None = parse, **options: object) -> object:
            _flushed()
            return _parse(response, **options) if _parse else response

        flushed.watches_flushes = True  # type: ignore[attr-defined]
        redis_client.set_response_callback(command, flushed)
    return redis_client


def is_cluster(redis_client: object) -> bool:
    """Whether every key of one call must share a slot (Redis Cluster), which decides how requests are sent."""
    kind = type(redis_client)
    found = _cluster_types.get(kind)
    if found is None:
        found = _cluster_types[kind] = issubclass(kind, RedisCluster)
    return found


# by client class: redis-py's classes derive from typing Protocols, whose isinstance() costs about a
# microsecond, on every request
_cluster_types: dict[type, bool] = {}


def cluster_configured() -> bool:
    """Whether RATELIMIT_CACHE uses ClusterConnectionFactory (known without connecting)."""
    global _cluster_configured
    if _cluster_configured is None:  # asked on every async decision: read once per settings change
        _cluster_configured = uses_cluster_factory()
    return _cluster_configured


_cluster_configured: bool | None = None


def uses_cluster_factory() -> bool:
    cache = settings.CACHES.get(get_setting("RATELIMIT_CACHE"), {})
    factory = cache.get("OPTIONS", {}).get("CONNECTION_FACTORY")
    factory = factory or getattr(settings, "DJANGO_REDIS_CONNECTION_FACTORY", "")
    if isinstance(factory, str):
        return factory.rsplit(".", 1)[-1] == ClusterConnectionFactory.__name__
    return isinstance(factory, type) and issubclass(factory, ClusterConnectionFactory)


class ClusterConnectionFactory(ConnectionFactory):
    """A django-redis connection factory whose clients are redis-py's RedisCluster.

    CACHES[alias]["OPTIONS"]["CONNECTION_FACTORY"] = "ratelimit_app.connection.ClusterConnectionFactory",
    with LOCATION the URL of any node (redis://10.0.0.5:7000): the client discovers the others.
    SOCKET_TIMEOUT, SOCKET_CONNECT_TIMEOUT, PASSWORD and USERNAME apply to every node; REDIS_CLIENT_KWARGS
    go to RedisCluster (e.g. a `retry`). One client per LOCATION and process, like django-redis's pools.
    """

    _clusters: dict[str, RedisCluster] = {}
    _lock = threading.Lock()

    def connect(self, url: str) -> RedisCluster:
        with self._lock:
            cluster = self._clusters.get(url)
            if cluster is None:
                cluster = self._clusters[url] = connect_cluster(url, self._options(url))
            return cluster

    def _options(self, url: str) -> dict:
        params = self.make_connection_params(url)
        params.pop("parser_class", None)  # RedisCluster picks its own parser (hiredis when installed)
        params.pop("url", None)
        return {**params, **self.redis_client_cls_kwargs}

    def disconnect(self, connection: RedisCluster) -> None:
        connection.disconnect_connection_pools()


def connect_cluster(url: str, options: dict) -> RedisCluster:
    """A RedisCluster for `url`; no node answering is an outage like any other (a ConnectionError).

    One quick retry, after which the client has re-read the topology (a replica promoted after a
    failover answers it): RedisCluster's default of retries with backoff would hold a request for
    seconds while a master is down, where the breaker should fail open or closed at once.
    """
    options.setdefault("retry", Retry(NoBackoff(), 1))
    try:
        return RedisCluster.from_url(url, **options)
    except RedisClusterException as error:  # RedisCluster connects as it is created
        raise redis.ConnectionError(f"Redis Cluster at {url} is unreachable: {error}") from error


DEFAULT_POOL_WAIT = 1.0  # seconds a call waits for a connection of a full pool without a socket timeout
# a connection closed by Redis while being opened or written to (nothing of the command ran): tried anew
WRITE_ATTEMPTS = 3


def packed_size(command: tuple, message: list) -> int:
    """The bytes a packed command kept by the decisions' clients holds (ratelimit_app.lru): the command's
    tuple and texts (about as long as the packed bytes, each text an object), and the packed bytes."""
    length = sum(map(len, message))
    return size_of(command, message) + 2 * length + 49 * len(command) + 33 * len(message)


def forget_clients() -> None:
    """The cache settings changed: the next call makes the client from them."""
    global _client, _cluster_configured
    _cluster_configured = None
    _client = None


def pool_retry(pool_kwargs: dict) -> Retry:
    """The Retry redis-py makes of these CONNECTION_POOL_KWARGS (its own rules for combining `retry`,
    `retry_on_error` and `retry_on_timeout`)."""
    names = ("retry", "retry_on_error", "retry_on_timeout")
    options = {name: pool_kwargs[name] for name in names if name in pool_kwargs}
    return redis.Connection(**options).retry


# --- redis-py's private attributes, read here only: they have no public accessor, and a redis-py release
# that renames one is mended in this one place (tests/test_architecture.py keeps them here)


def socket_of(connection) -> object | None:
    """The socket of a sync connection (None: not connected)."""
    return connection._sock


def writer_of(connection):
    """The asyncio StreamWriter of a connected asyncio connection."""
    return connection._writer


def hiredis_of(connection) -> tuple | None:
    """(hiredis reader, StreamReader, read size, RESP3's push type or None) of a connected asyncio
    connection whose replies hiredis parses, for aread_reply; None: its read_response() reads them."""
    parser = connection._parser
    reader = getattr(parser, "_reader", None)
    if type(parser) is not _AsyncHiredisParser or reader is None or connection.health_check_interval:
        return None
    return reader, parser._stream, parser._read_size, parser._hiredis_PushNotificationType


def unread(hiredis: tuple) -> bool:
    """A connection's can_read() from hiredis_of's parts, without its two coroutines: a reply or the end
    of file waits (what redis-py's hiredis parser checks; the StreamReader has no public test of its bytes)."""
    reader, stream = hiredis[:2]
    return reader.has_data() or stream.at_eof() or bool(stream._buffer)


class DirectReplies(asyncio.Protocol):
    """Put before redis-py's StreamReaderProtocol on a decision's connection: while a read waits, the bytes go
    straight to hiredis and the reply to the waiting future, in the loop's pass that read them (no StreamReader
    read, buffer or waiter of its own: a tenth of an async decision's instructions). Otherwise, and for every
    other event, redis-py's own protocol as before."""

    __slots__ = ("inner", "reader", "waiter")

    def __init__(self, inner: asyncio.BaseProtocol) -> None:
        self.inner = inner
        self.reader = None  # the connection's hiredis reader while `waiter` waits
        self.waiter: asyncio.Future | None = None

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None:
            self.inner.data_received(data)
            return
        try:
            self.reader.feed(data)
            reply = self.reader.gets()
        except BaseException as error:  # noqa: BLE001 - a protocol error of hiredis: the read raises it
            self._settle(error)
            return
        if reply is not NOT_ENOUGH_DATA:
            self.waiter = None
            if not waiter.done():  # (its deadline may have passed in this same pass)
                waiter.set_result(reply)

    def eof_received(self) -> bool | None:
        self._settle(redis.ConnectionError(CLOSED_BY_SERVER))
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle(exc if exc is not None else redis.ConnectionError(CLOSED_BY_SERVER))
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _settle(self, error: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


DIRECT = "_ratelimit_direct"  # on a connection's StreamReader: its socket's DirectReplies


def _direct_replies(connection, stream: asyncio.StreamReader) -> DirectReplies:
    """The connection's DirectReplies, put before its StreamReaderProtocol at its first read (once per socket,
    kept on the socket's StreamReader)."""
    transport = writer_of(connection).transport
    protocol = transport.get_protocol()
    if type(protocol) is not DirectReplies:
        protocol = DirectReplies(protocol)
        transport.set_protocol(protocol)
    setattr(stream, DIRECT, protocol)
    return protocol


async def aread_reply(connection, hiredis: tuple, deadlines) -> object:
    """read_reply()'s twin for an asyncio connection and its hiredis_of() parts: the same reply and errors
    as its read_response(), under the socket timeout kept by `deadlines` (aclients.Deadlines), without
    the wrapper's coroutines and the timer asyncio.timeout() arms and cancels on every read; the bytes go
    to hiredis as the loop reads them (DirectReplies)."""
    reader, stream, _size, push = hiredis
    timeout = connection.socket_timeout
    try:
        reply = reader.gets()
        if reply is NOT_ENOUGH_DATA:
            if stream._buffer:  # came while the write waited (connecting, draining): the StreamReader took them
                reader.feed(bytes(stream._buffer))
                stream._buffer.clear()
                reply = reader.gets()
        if reply is NOT_ENOUGH_DATA:
            if stream._exception is not None:  # (StreamReader.exception() and at_eof(), without their calls)
                raise stream._exception
            if stream._eof:
                raise redis.ConnectionError(CLOSED_BY_SERVER)
            protocol = stream.__dict__.get(DIRECT) or _direct_replies(connection, stream)
            waiter = protocol.waiter = deadlines.loop.create_future()
            protocol.reader = reader
            if timeout:
                deadlines.start(waiter, timeout)
            try:
                reply = await waiter
            finally:
                protocol.waiter = protocol.reader = None
                if timeout:
                    deadlines.end(waiter)
    except BaseException as error:  # the deadline passed (TimeoutError), the socket failed, or cancelled
        await connection.disconnect(nowait=True)
        _read_failed(connection, error)
    if push is not None and isinstance(reply, push):
        # RESP3's message out of band (a maintenance notice may relax the timeout): redis-py's handlers take
        # it, and its read_response() the reply, as it would have
        await connection._parser.handle_push_response(reply)
        return await connection.read_response()
    return _answer(reply)


def retry_parts(retry) -> tuple:
    """A Retry's backoff, retries and the errors it retries after, to make an asyncio Retry of the same."""
    return retry._backoff, retry._retries, retry._supported_errors


def retries(retry: Retry, *errors: type[Exception]) -> bool:
    """Whether `retry` sends a command again after one of `errors`."""
    supported = retry_parts(retry)[2]
    return retry.get_retries() > 0 and any(issubclass(error, supported) for error in errors)


def retries_timeouts(pool_kwargs: dict) -> bool:
    """Whether redis-py, given these CONNECTION_POOL_KWARGS, sends a command again after a timeout.

    redis-py's default Retry retries TimeoutError too, and `retry_on_error` only adds to its list:
    `retry_on_error=[ConnectionError]` alone retries timeouts. A stalled Redis then costs two
    timeouts, and executes the command twice once it wakes up.
    """
    return retries(pool_retry(pool_kwargs), redis.TimeoutError, socket.timeout)


def read_reply(connection: redis.Connection) -> object:
    """connection.read_response(), read straight from hiredis when redis-py parses with it (RESP2 or
    RESP3): the same reply and errors, under the socket's own timeout, without the wrapper's checks
    and calls (a tenth of a decision's Python)."""
    parser = getattr(connection, "_parser", None)  # none on a CacheProxyConnection (client-side caching)
    reader = getattr(parser, "_reader", None)
    if type(parser) is not _HiredisParser or reader is None or connection.health_check_interval:
        return connection.read_response()
    try:
        reply = reader.gets()
        if reply is NOT_ENOUGH_DATA:
            sock, buffer = parser._sock, parser._buffer
            while reply is NOT_ENOUGH_DATA:
                size = sock.recv_into(buffer)  # past the socket timeout: socket.timeout
                if not size:
                    raise redis.ConnectionError(CLOSED_BY_SERVER)
                reader.feed(buffer, 0, size)
                reply = reader.gets()
    except BaseException as error:  # a reply cut short stays in the reader: the connection cannot be used
        connection.disconnect()
        _read_failed(connection, error)
    push = parser._hiredis_PushNotificationType
    if push is not None and isinstance(reply, push):
        # RESP3's message out of band (a maintenance notice may relax the timeout): redis-py's handlers take
        # it, and its read_response() the reply, as it would have
        parser.handle_push_response(reply)
        return connection.read_response()
    return _answer(reply)


CLOSED_BY_SERVER = "Connection closed by server."  # redis-py's words for a reply's end of file


def _read_failed(connection, error: BaseException) -> NoReturn:
    """Raise what read_response() raises for `error`, met reading a reply on `connection` (closed since)."""
    if isinstance(error, TimeoutError):  # socket.timeout, or the asyncio deadline; before OSError, its base
        raise redis.TimeoutError(f"Timeout reading from {connection._host_error()}") from None
    if isinstance(error, OSError):
        raise redis.ConnectionError(f"Error while reading from {connection._host_error()} : {error.args}") from None
    raise error


def _answer(reply: object) -> object:
    """The reply hiredis parsed, as read_response() returns it: hiredis hands errors back as values."""
    if isinstance(reply, (redis.ResponseError, redis.ConnectionError)):
        raise reply
    if type(reply) is list and reply and isinstance(reply[0], redis.ConnectionError):
        raise reply[0]
    return reply
