"""System checks: misconfiguration is reported by `manage.py check`, not by a 500 later."""

from __future__ import annotations

import socket

import redis
from django.conf import settings
from django.core.checks import Error, Warning, register
from django.core.exceptions import ValidationError
from django.db import DatabaseError
from django.utils.module_loading import import_string

from .conf import get_setting


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


@register(deploy=False)
def check_policies(app_configs: object = None, **kwargs: object) -> list:
    from .models import Policy
    from .policies import compile_policy

    warnings = []
    try:
        rows = list(Policy.objects.all())
    except DatabaseError:
        return []  # not migrated yet: nothing to check
    for row in rows:
        try:
            compile_policy(row)
        except (ValidationError, ValueError, KeyError) as error:
            warnings.append(
                Warning(
                    f"Policy {row.name!r} (id {row.pk}) is invalid and is ignored: {error}",
                    hint="Fix it in the admin; requests are not limited by it meanwhile.",
                    obj=row,
                    id="ratelimit_app.W001",
                )
            )
    return warnings


@register()
def check_timeouts(app_configs: object = None, **kwargs: object) -> list:
    alias = get_setting("RATELIMIT_CACHE")
    options = settings.CACHES.get(alias, {}).get("OPTIONS", {})
    missing = [name for name in ("SOCKET_CONNECT_TIMEOUT", "SOCKET_TIMEOUT") if not options.get(name)]
    if not missing or not settings.CACHES.get(alias, {}).get("BACKEND", "").startswith("django_redis."):
        return []
    return [
        Warning(
            f"The cache {alias!r} sets no {' and no '.join(missing)}: if Redis stops answering, requests "
            "wait for the operating system's timeouts before rate limiting fails open or closed.",
            hint="Add e.g. 'SOCKET_CONNECT_TIMEOUT': 0.25, 'SOCKET_TIMEOUT': 0.25 to its OPTIONS.",
            id="ratelimit_app.W002",
        )
    ]


RECOMMENDED_RETRY = ("'CONNECTION_POOL_KWARGS': {'retry': Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))} "
                     "(from redis.retry and redis.backoff), without retry_on_error or retry_on_timeout")


@register()
def check_retries(app_configs: object = None, **kwargs: object) -> list:
    from .connection import pool_retry, retries, uses_cluster_factory

    alias = get_setting("RATELIMIT_CACHE")
    cache = settings.CACHES.get(alias, {})
    if not cache.get("BACKEND", "").startswith("django_redis.") or uses_cluster_factory():
        return []  # a cluster client retries by its own rules (connect_cluster)
    pool_kwargs = cache.get("OPTIONS", {}).get("CONNECTION_POOL_KWARGS", {})
    try:
        retry = pool_retry(pool_kwargs)
    except (TypeError, ValueError, AttributeError) as error:
        return [Error(f"The cache {alias!r} has CONNECTION_POOL_KWARGS redis-py refuses: {error}", id="ratelimit_app.E004")]
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


RATELIMIT_MIDDLEWARE = "ratelimit_app.middleware.RateLimitMiddleware"
AUTHENTICATION_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


@register()
def check_middleware_order(app_configs: object = None, **kwargs: object) -> list:
    """Policies counted per user need request.user, which AuthenticationMiddleware sets: before it (or
    without it) they silently never apply, and user_or_ip counts every user by address."""
    limiter_at = _position(RATELIMIT_MIDDLEWARE)
    if limiter_at is None:
        return []
    authentication_at = _position(AUTHENTICATION_MIDDLEWARE)
    if authentication_at is not None and authentication_at < limiter_at:
        return []
    counting_users = _policies_counting_users()
    if not counting_users:
        return []
    where = "is not in MIDDLEWARE" if authentication_at is None else "comes after RateLimitMiddleware"
    return [
        Warning(
            f"AuthenticationMiddleware {where}, so RateLimitMiddleware never sees who is logged in: policies "
            f"counted per user ({', '.join(counting_users)}) do not apply, and 'user_or_ip' counts every "
            "user by address.",
            hint=f"Put '{RATELIMIT_MIDDLEWARE}' right after '{AUTHENTICATION_MIDDLEWARE}' in MIDDLEWARE.",
            id="ratelimit_app.W004",
        )
    ]


@register()
def check_trusted_proxies(app_configs: object = None, **kwargs: object) -> list:
    from .subjects import invalid_trusted_proxies

    invalid = invalid_trusted_proxies()
    if not invalid:
        return []
    return [
        Error(
            f"RATELIMIT_TRUSTED_PROXIES holds {', '.join(invalid)}, neither an address, a network nor 'unix'; "
            "it is ignored.",
            hint="Use addresses or networks ('10.0.0.1', '10.0.0.0/8'), and 'unix' for a proxy talking to "
            "this server through a unix socket.",
            id="ratelimit_app.E003",
        )
    ]


def _position(middleware: str) -> int | None:
    """Where `middleware` (or a subclass of it) stands in MIDDLEWARE, or None."""
    wanted = import_string(middleware)
    for position, path in enumerate(settings.MIDDLEWARE):
        try:
            candidate = import_string(path)
        except ImportError:
            continue  # Django reports an unimportable middleware itself when it loads it
        if isinstance(candidate, type) and issubclass(candidate, wanted):
            return position
    return None


def _policies_counting_users() -> list[str]:
    from .models import Policy
    from .policies import compile_policy

    try:
        rows = list(Policy.objects.filter(enabled=True).order_by("name"))
    except DatabaseError:
        return []  # not migrated yet: no policies
    names = []
    for row in rows:
        try:
            if compile_policy(row).counts_users:
                names.append(row.name)
        except (ValidationError, ValueError, KeyError):
            continue  # an invalid policy is reported by ratelimit_app.W001
    return names


@register()
def check_metrics(app_configs: object = None, **kwargs: object) -> list:
    from . import metrics

    if get_setting("RATELIMIT_METRICS") and metrics.prometheus_client is None:
        return [
            Warning(
                "RATELIMIT_METRICS is True but prometheus_client is not installed: no metric is recorded.",
                hint="pip install prometheus_client, or remove RATELIMIT_METRICS.",
                id="ratelimit_app.W005",
            )
        ]
    return []


@register()
def check_shards(app_configs: object = None, **kwargs: object) -> list:
    from .connection import cluster_configured

    shards = get_setting("RATELIMIT_SHARDS")
    if not (isinstance(shards, int) and not isinstance(shards, bool) and 1 <= shards <= 16384):
        return [
            Error(
                f"RATELIMIT_SHARDS is {shards!r}; it must be a whole number from 1 to 16384 (the default is 1).",
                hint="On Redis Cluster, a few times the number of masters spreads the load (16 for 3 masters).",
                id="ratelimit_app.E016",
            )
        ]
    if shards == 1 and cluster_configured():
        return [
            Error(
                "RATELIMIT_SHARDS is 1 with ClusterConnectionFactory: Redis Cluster needs the shards' hash tags.",
                hint="Set RATELIMIT_SHARDS to a few times the number of masters (16 for 3 masters).",
                id="ratelimit_app.E017",
            )
        ]
    return []
