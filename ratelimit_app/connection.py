"""The Redis clients of RATELIMIT_CACHE: the shared one, the asyncio one per event loop, Redis Cluster's;
what the cache's retry options mean."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import weakref

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

# the names tests and bench reach through this module since before the breaker had a module of its own
from .breaker import RedisCommandError, RedisUnavailable, breaker, describe, is_outage, outage  # noqa: F401
from .conf import get_setting

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
