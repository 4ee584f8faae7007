"""The Redis clients of RATELIMIT_CACHE: the shared one, the asyncio one per event loop, Redis Cluster's;
what the cache's retry options mean."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from typing import Callable

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django_redis import get_redis_connection
from django_redis.pool import ConnectionFactory
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from .breaker import (  # noqa: F401  (the names tests and bench reach through this module)
    PoolFull, RedisCommandError, RedisUnavailable, ReplyLost, breaker, describe, is_outage, outage,
)
from .conf import get_setting

_client: redis.Redis | RedisCluster | None = None


def client() -> redis.Redis | RedisCluster:
    """The django-redis client of RATELIMIT_CACHE (thread-safe; looked up once, not per request).

    A redis.Redis for one server or Sentinel (django-redis's SentinelConnectionFactory), a
    redis.cluster.RedisCluster when the cache uses ClusterConnectionFactory below.
    """
    global _client
    if _client is None:
        _client = _watch_flushes(get_redis_connection(get_setting("RATELIMIT_CACHE")))
    return _client


_on_flush: list[Callable[[], None]] = []


def when_flushed(forget: Callable[[], None]) -> None:
    """Call `forget` whenever Redis answers a FLUSHDB or FLUSHALL sent through the app's client (what
    django-redis' cache.clear() sends in a test, in the thread that decides): what the process
    remembers of Redis' data is gone with it. A flush from elsewhere shows at the next version check."""
    _on_flush.append(forget)


def _watch_flushes(redis_client: redis.Redis | RedisCluster) -> redis.Redis | RedisCluster:
    callbacks = getattr(redis_client, "response_callbacks", None)
    if callbacks is None:
        return redis_client
    for command in ("FLUSHDB", "FLUSHALL"):
        if getattr(callbacks.get(command), "watches_flushes", False):
            continue  # django-redis hands the same client out again
        parse = callbacks.get(command)

        def flushed(response: object, _parse: Callable | None = parse, **options: object) -> object:
            for forget in _on_flush:
                forget()
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
    factory = cache.get("OPTIONS", {}).get("CONNECTION_FACTORY") or getattr(settings, "DJANGO_REDIS_CONNECTION_FACTORY", "")
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
            del _async_clients[old]  # closed without shutting its async generators down: the collector closes their sockets
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
        found = redis.asyncio.sentinel.Sentinel(addresses, manager.min_other_sentinels, sentinel_kwargs, **connection_kwargs)
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


DEFAULT_POOL_WAIT = 1.0  # seconds a call waits for a connection of a full pool without a socket timeout
# a connection closed by Redis while being opened or written to (nothing of the command ran): tried anew
WRITE_ATTEMPTS = 3


class SentOnce(redis.asyncio.Redis):
    """The asyncio client of decisions: each command written once, on a connection the pool found
    open, never again by a retry policy (a reply lost with its connection may have counted)."""

    async def execute_command(self, *args: object, **options: object) -> object:
        if options:
            return await super().execute_command(*args, **options)
        pool = self.connection_pool
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                connection = await pool.get_connection()  # connects when need be: nothing written yet
                break
            except redis.ConnectionError as error:
                if isinstance(pool, redis.asyncio.BlockingConnectionPool) and str(error) == "No connection available.":
                    raise PoolFull(f"every one of the {pool.max_connections} connections of the pool stayed in use") from error
                if attempt == WRITE_ATTEMPTS:
                    raise
        try:
            return await self._once(connection, args)
        except BaseException:
            await connection.disconnect(nowait=True)  # cancelled or failed with a reply unread
            raise
        finally:
            await pool.release(connection)

    async def _once(self, connection: redis.asyncio.Connection, args: tuple) -> object:
        # closed by Redis while at rest (its end of file read by the loop): the pool does not always
        # check (not with RESP3's maintenance notifications), so it is checked here, before writing
        if connection.is_connected and await connection.can_read():
            await connection.disconnect()
        message = connection.pack_command(*args)
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                await connection.send_packed_command(message, check_health=False)
                break
            except redis.ConnectionError:  # nothing reached Redis whole: safe to send anew
                await connection.disconnect()
                if attempt == WRITE_ATTEMPTS:
                    raise
        try:
            return await self.parse_response(connection, args[0])
        except redis.ConnectionError as error:
            raise ReplyLost(f"the connection closed before Redis answered ({describe(error)}); the call may "
                            "have counted, and is not sent again") from error


def _async_connection_kwargs(connection_class: type, kwargs: dict) -> dict:
    """A sync connection's options for an asyncio one: the same values, but its own parser and retry type."""
    own = ("parser_class", "connection_pool")  # the sync parser; a Sentinel pool's link to itself
    converted = _accepted(connection_class, {name: value for name, value in kwargs.items() if name not in own})
    retry = converted.get("retry")
    if retry is not None and not isinstance(retry, redis.asyncio.retry.Retry):
        converted["retry"] = redis.asyncio.retry.Retry(retry._backoff, retry._retries, retry._supported_errors)
    return converted


def _accepted(cls: type, kwargs: dict) -> dict:
    """The keyword arguments that `cls` (or a base class it passes **kwargs to) takes."""
    names = {name for klass in cls.__mro__ if "__init__" in vars(klass)
             for name in inspect.signature(klass.__init__).parameters}
    return {name: value for name, value in kwargs.items() if name in names}


def forget_clients() -> None:
    """The cache settings changed: every client, kept connection and circuit starts from them anew."""
    global _client, _cluster_configured
    _cluster_configured = None
    _client = None
    with _async_lock:
        _async_clients.clear()  # each closes with its loop all the same (its generator is then collected)


def pool_retry(pool_kwargs: dict) -> Retry:
    """The Retry redis-py makes of these CONNECTION_POOL_KWARGS (its own rules for combining `retry`,
    `retry_on_error` and `retry_on_timeout`)."""
    options = {name: pool_kwargs[name] for name in ("retry", "retry_on_error", "retry_on_timeout") if name in pool_kwargs}
    return redis.Connection(**options).retry


def retries(retry: Retry, *errors: type[Exception]) -> bool:
    """Whether `retry` sends a command again after one of `errors`."""
    return retry.get_retries() > 0 and any(issubclass(error, retry._supported_errors) for error in errors)  # no public accessor


def retries_timeouts(pool_kwargs: dict) -> bool:
    """Whether redis-py, given these CONNECTION_POOL_KWARGS, sends a command again after a timeout.

    redis-py's default Retry retries TimeoutError too, and `retry_on_error` only adds to its list:
    `retry_on_error=[ConnectionError]` alone retries timeouts. A stalled Redis then costs two
    timeouts, and executes the command twice once it wakes up.
    """
    return retries(pool_retry(pool_kwargs), redis.TimeoutError, socket.timeout)
