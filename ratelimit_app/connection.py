"""The request path's Redis client and its circuit breaker: one place that knows Redis can fail."""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

import redis
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


@receiver(setting_changed, dispatch_uid="ratelimit_cache_changed")
def _forget_client(setting: str, **kwargs: object) -> None:
    global _client
    if setting in ("CACHES", "RATELIMIT_CACHE"):
        _client = None
