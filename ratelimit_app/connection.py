"""The request path's Redis client and its circuit breaker: one place that knows Redis can fail."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Awaitable, Callable, TypeVar

import redis
import redis.asyncio
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django_redis import get_redis_connection

from .conf import get_setting

T = TypeVar("T")


class RedisUnavailable(Exception):
    """Redis could not answer (down, timed out, or the circuit is open); the doors apply RATELIMIT_FAIL_OPEN."""


class CircuitBreaker:
    """After a Redis error, fail fast for a while instead of adding a timeout to every request."""

    def __init__(self) -> None:
        self.open_until = 0.0
        self.failures = 0  # Redis errors seen, for monitoring
        self._lock = threading.Lock()

    def call(self, operation: Callable[[], T]) -> T:
        if self.open_until and time.monotonic() < self.open_until:
            raise RedisUnavailable("Redis circuit is open after a recent error")
        try:
            result = operation()
        except redis.RedisError as error:
            with self._lock:
                self.failures += 1
                self.open_until = time.monotonic() + get_setting("RATELIMIT_BREAKER_SECONDS")
            raise RedisUnavailable(f"Redis error: {error}") from error
        self.open_until = 0.0
        return result

    async def acall(self, operation: Callable[[], Awaitable[T]]) -> T:
        """call() for the asyncio client: the same circuit, shared by sync and async requests."""
        if self.open_until and time.monotonic() < self.open_until:
            raise RedisUnavailable("Redis circuit is open after a recent error")
        try:
            result = await operation()
        except redis.RedisError as error:
            with self._lock:
                self.failures += 1
                self.open_until = time.monotonic() + get_setting("RATELIMIT_BREAKER_SECONDS")
            raise RedisUnavailable(f"Redis error: {error}") from error
        self.open_until = 0.0
        return result

    def reset(self) -> None:
        self.open_until = 0.0


breaker = CircuitBreaker()


_client: redis.Redis | None = None


def client() -> redis.Redis:
    """The django-redis client of RATELIMIT_CACHE (thread-safe; looked up once, not per request)."""
    global _client
    if _client is None:
        _client = get_redis_connection(get_setting("RATELIMIT_CACHE"))
    return _client


# asyncio connections belong to the event loop that opened them: one client per loop
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = weakref.WeakKeyDictionary()
ASYNC_POOL_KWARGS = ("max_connections", "retry_on_error", "health_check_interval", "socket_keepalive", "client_name")


def aclient() -> redis.asyncio.Redis:
    """An asyncio client for the running loop, built from the same cache settings (same server, same keys)."""
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is None:
        found = _async_clients[loop] = _async_client_from_cache(settings.CACHES[get_setting("RATELIMIT_CACHE")])
    return found


def _async_client_from_cache(cache: dict) -> redis.asyncio.Redis:
    location = cache["LOCATION"]
    url = location[0] if isinstance(location, (list, tuple)) else location.split(",")[0]
    options = cache.get("OPTIONS", {})
    kwargs = {name: value for name, value in options.get("CONNECTION_POOL_KWARGS", {}).items() if name in ASYNC_POOL_KWARGS}
    if options.get("PASSWORD"):
        kwargs["password"] = options["PASSWORD"]
    for option, name in (("SOCKET_TIMEOUT", "socket_timeout"), ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout")):
        if options.get(option) is not None:
            kwargs[name] = options[option]
    return redis.asyncio.Redis.from_url(url, **kwargs)


@receiver(setting_changed, dispatch_uid="ratelimit_cache_changed")
def _forget_client(setting: str, **kwargs: object) -> None:
    global _client
    if setting in ("CACHES", "RATELIMIT_CACHE"):
        _client = None
        _async_clients.clear()
