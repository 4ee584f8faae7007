"""The request path's Redis client and its circuit breaker: one place that knows Redis can fail."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import threading
import time
import weakref
from typing import Awaitable, Callable, NoReturn, TypeVar

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

from . import events
from .conf import get_setting

T = TypeVar("T")
logger = logging.getLogger("ratelimit_app")
OUTAGE_ATTRIBUTE = "_ratelimit_outage"


class RedisUnavailable(Exception):
    """Redis could not decide (down, timed out, the circuit is open, or it answered with an error);
    the doors apply RATELIMIT_FAIL_OPEN."""


class RedisCommandError(RedisUnavailable):
    """Redis answered, with an error (WRONGTYPE, READONLY, a Lua error): not an outage, nothing decided."""


def is_outage(error: redis.RedisError) -> bool:
    """Redis did not answer (refused, timed out, cluster down); any other error is an answer."""
    if isinstance(error, (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError)):
        return True
    return not isinstance(error, redis.ResponseError)


def describe(error: BaseException) -> str:
    """The error as a log line: redis-py names the address ('Error 111 connecting to 127.0.0.1:6390');
    the code it strips from an error reply ('READONLY', 'WRONGTYPE'...) is put back in front."""
    code = getattr(error, "status_code", None)
    message = str(error)
    if code and not message.startswith(code):
        message = f"{code} {message}"
    return f"{type(error).__name__}: {message}"


class CircuitBreaker:
    """After Redis failed to answer, fail fast for a while instead of adding a timeout to every request.

    Closed: calls go to Redis. Open, for RATELIMIT_BREAKER_SECONDS after an outage: calls fail at once
    with the outage's cause. Half-open, then: one call probes Redis while the others keep failing at
    once; its answer closes the circuit, its failure opens it again. An error Redis answers with is
    no outage (it costs no timeout): it is logged with its message, counted in `errors`, and leaves
    the circuit closed.
    """

    def __init__(self) -> None:
        self.open_until = 0.0
        self.failures = 0  # outages seen (refused, timed out), for monitoring
        self.errors = 0  # errors Redis answered with, for monitoring
        self.cause = ""  # the last outage, named by the calls that fail fast meanwhile
        self._probe = threading.Lock()
        self._count = threading.Lock()
        self._error_logged_at = 0.0

    def call(self, operation: Callable[[], T]) -> T:
        probing = self._admit()
        try:
            result = operation()
        except redis.RedisError as error:
            self._failed(error)
        finally:
            if probing:
                self._probe.release()
        self._closed()
        return result

    async def acall(self, operation: Callable[[], Awaitable[T]]) -> T:
        """call() for the asyncio client: the same circuit, shared by sync and async requests."""
        probing = self._admit()
        try:
            result = await operation()
        except redis.RedisError as error:
            self._failed(error)
        finally:
            if probing:
                self._probe.release()
        self._closed()
        return result

    def _admit(self) -> bool:
        """Whether this call may go to Redis (raises RedisUnavailable if not); True when it is the
        half-open circuit's one probe, which holds the probe lock until it has an answer."""
        if not self.open_until:
            return False
        if time.monotonic() < self.open_until or not self._probe.acquire(blocking=False):
            raise RedisUnavailable(self.cause)
        return True

    def _failed(self, error: redis.RedisError) -> NoReturn:
        if is_outage(error):
            self._open(error)
            raise RedisUnavailable(self.cause) from error
        self._closed()  # Redis answered: it is up
        self._answered_with(error)
        raise RedisCommandError(describe(error)) from error

    def _open(self, error: redis.RedisError) -> None:
        with self._count:
            self.failures += 1
            self.cause = describe(error)
            self.open_until = time.monotonic() + get_setting("RATELIMIT_BREAKER_SECONDS")
        # the threads' kept connections are taken from the pool again, which finds the server anew
        # (a Sentinel's new master: a kept connection reconnects to the address it had)
        unpin()
        events.breaker_opened(error)

    def _closed(self) -> None:
        if self.open_until:  # the first answer after an outage
            self.open_until = 0.0
            events.breaker_closed()

    def _answered_with(self, error: redis.RedisError) -> None:
        with self._count:
            self.errors += 1
            now = time.monotonic()
            if now - self._error_logged_at < get_setting("RATELIMIT_BREAKER_SECONDS"):
                return
            self._error_logged_at = now
        logger.error("ratelimit: Redis answered with an error (%d so far): %s", self.errors, describe(error))
        if isinstance(error, redis.ReadOnlyError):
            # a replica after a failover: pooled connections still point at the old primary, while a
            # new connection to the same address may reach the new one (a cluster client has no
            # single pool, and follows failovers itself)
            pool = getattr(client(), "connection_pool", None)
            if pool is not None:
                pool.disconnect(inuse_connections=False)
            unpin()  # and each thread's kept connection, at its next call

    def reset(self) -> None:
        """Close the circuit, and log the next error at once (tests start from here)."""
        self.open_until = 0.0
        self._error_logged_at = 0.0


breaker = CircuitBreaker()


class Outage:
    """Counts requests let through or refused because Redis could not decide; logs once per interval."""

    def __init__(self) -> None:
        self.requests = 0
        self._logged_at = 0.0
        self._lock = threading.Lock()

    def record(self, error: RedisUnavailable, request: object = None) -> None:
        """Count one request; given the request, a second door reporting the same request adds nothing."""
        if request is not None:
            base = request.__dict__.get("_request", request)  # a DRF Request wraps Django's
            if base.__dict__.get(OUTAGE_ATTRIBUTE):
                return
            base.__dict__[OUTAGE_ATTRIBUTE] = True
        with self._lock:
            self.requests += 1
            now = time.monotonic()
            if now - self._logged_at < get_setting("RATELIMIT_BREAKER_SECONDS"):
                return
            self._logged_at = now
        action = "letting requests through" if get_setting("RATELIMIT_FAIL_OPEN") else "refusing requests (503)"
        what = "Redis answered with an error" if isinstance(error, RedisCommandError) else "Redis unavailable"
        logger.warning("ratelimit: %s, %s (%d so far): %s", what, action, self.requests, error)


outage = Outage()


_client: redis.Redis | RedisCluster | None = None


def client() -> redis.Redis | RedisCluster:
    """The django-redis client of RATELIMIT_CACHE (thread-safe; looked up once, not per request).

    A redis.Redis for one server or Sentinel (django-redis's SentinelConnectionFactory), a
    redis.cluster.RedisCluster when the cache uses ClusterConnectionFactory below.
    """
    global _client
    if _client is None:
        _client = get_redis_connection(get_setting("RATELIMIT_CACHE"))
    return _client


class _Pinned(threading.local):
    generation = -1  # the _generation the client was made in
    client: redis.Redis | RedisCluster | None = None
    packed: dict = {}  # commands sent through the kept connection, as redis-py packed them (each _pin makes its own)


MAX_PACKED = 256  # packed commands a thread keeps: a subject's repeat requests send the same command


_pinned = _Pinned()
_generation = 0  # moves on when the cache settings change, after an outage or a failover (see unpin)


def decision_client() -> redis.Redis | RedisCluster:
    """The client of the request path's one call: client() made to keep one pooled connection for
    this thread (redis-py's single_connection_client).

    A command through the pool takes a connection and puts it back, checking it each time: about
    a sixth of the client's time for a decision. Each thread that decides keeps one connection
    instead, as long as the thread lives (given back to the pool when it ends), while at most half
    of the pool's max_connections are kept so: the other threads' calls, and everything else that
    uses the pool, go through client(). A cluster client has a pool per node: it is used as it is.
    After an outage every thread takes its connection from the pool again (see unpin).
    """
    if _pinned.generation == _generation:
        return _pinned.client
    return _pin()


def execute(redis_client: redis.Redis | RedisCluster, *command: object, **options: object) -> object:
    """redis_client.execute_command(*command, **options), for the request path's one call.

    On a client that keeps a connection (decision_client) the command goes straight through it:
    redis-py's own send and read, retried by the connection's retry policy as the client would
    (disconnecting after each failure, so that the next attempt reconnects). What the client adds
    around them on every command (a lock for threads sharing it, timing hooks, checks for
    maintenance events) serves shared clients, and measured a sixth of a decision's CPU. Any other
    client, or a command with options (a cluster's target node): execute_command.
    """
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
    # a subject's repeat request sends the same command as before: packed once (a tenth of the
    # client's time for a decision), then sent again as it was
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


# asyncio connections belong to the event loop that opened them: one client per loop
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = weakref.WeakKeyDictionary()


def aclient() -> redis.asyncio.Redis:
    """An asyncio client for the running loop, to the server the sync client reaches, logged in the same way."""
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is None:
        options = settings.CACHES[get_setting("RATELIMIT_CACHE")].get("OPTIONS", {})
        found = _async_clients[loop] = async_twin(client(), options.get("REDIS_CLIENT_KWARGS", {}))
    return found


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
        return pick(pool.service_name, max_connections=pool.max_connections, **client_kwargs)
    connection_class = _ASYNC_CONNECTIONS.get(pool.connection_class)
    if connection_class is None:
        raise ImproperlyConfigured(f"ratelimit_app has no asyncio counterpart of {pool.connection_class.__name__}")
    async_pool = redis.asyncio.ConnectionPool(
        connection_class=connection_class, max_connections=pool.max_connections,
        **_async_connection_kwargs(connection_class, pool.connection_kwargs),
    )
    return redis.asyncio.Redis(connection_pool=async_pool, **client_kwargs)


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
    _async_clients.clear()
    unpin()
    breaker.reset()


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
