"""The operator's own Redis client: live page, policy list, resets and version bumps, apart from requests.

It has its own pool and a short timeout (RATELIMIT_ADMIN_TIMEOUT), and its errors never open the
circuit breaker that the request path uses: watching or editing policies cannot stop enforcement.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import redis

from ..conf import get_setting
from .circuit import RedisUnavailable
from .clients import client, connect_cluster, is_cluster

T = TypeVar("T")

_client: redis.Redis | None = None


def admin_client() -> redis.Redis:
    """A client of RATELIMIT_CACHE's server with its own pool and RATELIMIT_ADMIN_TIMEOUT."""
    global _client
    if _client is None:
        main = client()  # the request path's (caches[alias] would be one more cache Django closes per request)
        timeout = get_setting("RATELIMIT_ADMIN_TIMEOUT")
        if is_cluster(main):  # a RedisCluster of its own, from a node the request path's client knows
            node = main.get_default_node()
            options = {name: value for name, value in node.redis_connection.connection_pool.connection_kwargs.items()
                       if name in ("username", "password")}
            _client = connect_cluster(f"redis://{node.host}:{node.port}", {
                **options, "socket_timeout": timeout, "socket_connect_timeout": timeout})
        else:
            pool = main.connection_pool
            options = {**pool.connection_kwargs, "socket_timeout": timeout, "socket_connect_timeout": timeout}
            own_pool = redis.ConnectionPool(connection_class=pool.connection_class, **options)
            _client = redis.Redis(connection_pool=own_pool)
    return _client


def forget_client() -> None:
    """The cache settings changed: the next admin read makes a client from them."""
    global _client
    _client = None


def admin_call(operation: Callable[[redis.Redis], T]) -> T:
    """Run an operator's read or write; a Redis error becomes RedisUnavailable, the breaker is not told."""
    try:
        return operation(admin_client())
    except redis.RedisError as error:
        raise RedisUnavailable(f"Redis error: {error}") from error
