"""System checks of the cache ratelimit_app reaches Redis through: a django-redis cache, its timeouts
and retries, and the shards a cluster needs."""

from __future__ import annotations

import socket

import redis
from django.conf import settings
from django.core.checks import Error, Warning, register
from redis.connection import parse_url

from ..conf import OutOfRange, get_setting, read_setting, written


@register()
def check_cache(app_configs: object = None, **kwargs: object) -> list:
    alias = get_setting("RATELIMIT_CACHE")
    backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
    if alias not in settings.CACHES:
        return [Error(f"RATELIMIT_CACHE names the cache {alias!r}, which is not in CACHES.", id="ratelimit_app.E001")]
    if not backend.startswith("django_redis."):
        return [
            Error(
                f"The cache {alias!r} uses {backend}; ratelimit_app needs a django-redis cache "
                "(django_redis.cache.RedisCache) shared by every worker.",
                id="ratelimit_app.E002",
            )
        ]
    return []


TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout", "SOCKET_TIMEOUT": "socket_timeout"}


def _pool_kwargs(cache: dict) -> dict:
    """CONNECTION_POOL_KWARGS with the LOCATION's query over them: django-redis hands both to redis-py's
    ConnectionPool.from_url, where the URL's options win."""
    found = dict(cache.get("OPTIONS", {}).get("CONNECTION_POOL_KWARGS", {}))
    for location in sorted(_locations(cache)):
        try:
            found.update({name: value for name, value in parse_url(location).items() if name not in ("host", "port")})
        except ValueError:
            pass  # not a URL redis-py reads: django-redis says so when it connects
    return found


def _timeouts(cache: dict) -> dict:
    """The cache's timeouts as redis-py's pool gets them: OPTIONS, under the pool's kwargs (_pool_kwargs)."""
    options, pool_kwargs = cache.get("OPTIONS", {}), _pool_kwargs(cache)
    return {name: pool_kwargs.get(kwarg, options.get(name)) for name, kwarg in TIMEOUTS.items()}


@register()
def check_timeouts(app_configs: object = None, **kwargs: object) -> list:
    alias = get_setting("RATELIMIT_CACHE")
    cache = settings.CACHES.get(alias, {})
    missing = [name for name, value in _timeouts(cache).items() if not value]
    if not missing or not cache.get("BACKEND", "").startswith("django_redis."):
        return []
    return [
        Warning(
            f"The cache {alias!r} sets no {' and no '.join(missing)}: if Redis stops answering, requests "
            "wait for the operating system's timeouts before rate limiting fails open or closed.",
            hint="Add e.g. 'SOCKET_CONNECT_TIMEOUT': 0.25, 'SOCKET_TIMEOUT': 0.25 to its OPTIONS.",
            id="ratelimit_app.W002",
        )
    ]


# the OPTIONS that make a django-redis cache's connections (its serializer or compressor do not)
CONNECTION_OPTIONS = (
    "CONNECTION_FACTORY", "CONNECTION_POOL_CLASS", "CONNECTION_POOL_KWARGS", "PARSER_CLASS", "PASSWORD",
    "REDIS_CLIENT_CLASS", "REDIS_CLIENT_KWARGS", "SENTINELS", "SENTINEL_KWARGS", "SOCKET_CONNECT_TIMEOUT",
    "SOCKET_TIMEOUT", "USERNAME",
)


def _locations(cache: dict) -> set[str]:
    location = cache.get("LOCATION") or ()
    return set(location.split(",") if isinstance(location, str) else location)


def _connection_options(cache: dict) -> dict:
    options = cache.get("OPTIONS", {})
    return {name: options[name] for name in CONNECTION_OPTIONS if name in options}


@register()
def check_shared_location(app_configs: object = None, **kwargs: object) -> list:
    alias = get_setting("RATELIMIT_CACHE")
    cache = settings.CACHES.get(alias, {})
    if not cache.get("BACKEND", "").startswith("django_redis."):
        return []
    sharing = [
        other for other, config in settings.CACHES.items()
        if other != alias and config.get("BACKEND", "").startswith("django_redis.")
        and _locations(config) & _locations(cache) and _connection_options(config) != _connection_options(cache)
    ]
    if not sharing:
        return []
    return [
        Warning(
            f"The cache {alias!r} has a LOCATION of the cache {sharing[0]!r} with other connection OPTIONS: "
            "django-redis keeps one connection pool per LOCATION, made with the options of whichever of them "
            "connects first, so one cache's timeouts, retries and login apply to both.",
            hint=f"Give {alias!r} a LOCATION of its own, e.g. another database number (redis://host:6379/1), "
                 "or the same connection OPTIONS.",
            id="ratelimit_app.W008",
        )
    ]


RECOMMENDED_RETRY = ("'CONNECTION_POOL_KWARGS': "
                     "{'retry': Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))} "
                     "(from redis.retry and redis.backoff), without retry_on_error or retry_on_timeout")


@register()
def check_retries(app_configs: object = None, **kwargs: object) -> list:
    from ..engine import pool_retry, retries, uses_cluster_factory

    alias = get_setting("RATELIMIT_CACHE")
    cache = settings.CACHES.get(alias, {})
    if not cache.get("BACKEND", "").startswith("django_redis.") or uses_cluster_factory():
        return []  # a cluster client retries by its own rules (connect_cluster)
    try:
        retry = pool_retry(_pool_kwargs(cache))
    except (TypeError, ValueError, AttributeError) as error:
        return [Error(f"The cache {alias!r} has CONNECTION_POOL_KWARGS redis-py refuses: {error}",
                      id="ratelimit_app.E004")]
    if retries(retry, redis.TimeoutError, socket.timeout):
        return [
            Warning(
                f"The cache {alias!r} retries commands that timed out: a stalled Redis costs each request two "
                "timeouts, and runs the command twice when it wakes up (a request counted twice).",
                hint=f"Retry only a broken connection: {RECOMMENDED_RETRY}.",
                id="ratelimit_app.W003",
            )
        ]
    if not retries(retry, redis.ConnectionError):
        return [
            Warning(
                f"The cache {alias!r} never retries a broken connection: a connection that Redis or a proxy "
                "closed (idle timeout, restart, failover) costs the request that finds it an outage.",
                hint=f"Retry a broken connection once: {RECOMMENDED_RETRY}.",
                id="ratelimit_app.W006",
            )
        ]
    return []


@register()
def check_shards(app_configs: object = None, **kwargs: object) -> list:
    from ..engine import cluster_configured

    shards = written("RATELIMIT_SHARDS")
    try:
        shards = read_setting("RATELIMIT_SHARDS", shards)
    except OutOfRange:
        return [
            Error(
                f"RATELIMIT_SHARDS is {shards!r}; it must be a whole number from 1 to 16384 (the default is 1).",
                hint="On Redis Cluster, a few times the number of masters spreads the load (16 for 3 masters).",
                id="ratelimit_app.E016",
            )
        ]
    except (TypeError, ValueError):
        return []  # not a whole number at all: E021 says so
    if shards == 1 and cluster_configured():
        return [
            Error(
                "RATELIMIT_SHARDS is 1 with ClusterConnectionFactory: Redis Cluster needs the shards' hash tags.",
                hint="Set RATELIMIT_SHARDS to a few times the number of masters (16 for 3 masters).",
                id="ratelimit_app.E017",
            )
        ]
    return []
