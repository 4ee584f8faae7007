"""System checks: misconfiguration is reported by `manage.py check`, not by a 500 later."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.core.exceptions import ValidationError
from django.db import DatabaseError

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


@register()
def check_retries(app_configs: object = None, **kwargs: object) -> list:
    from .connection import retries_timeouts

    alias = get_setting("RATELIMIT_CACHE")
    cache = settings.CACHES.get(alias, {})
    if not cache.get("BACKEND", "").startswith("django_redis."):
        return []
    pool_kwargs = cache.get("OPTIONS", {}).get("CONNECTION_POOL_KWARGS", {})
    try:
        retried = retries_timeouts(pool_kwargs)
    except (TypeError, ValueError, AttributeError) as error:
        return [Error(f"The cache {alias!r} has CONNECTION_POOL_KWARGS redis-py refuses: {error}", id="ratelimit_app.E004")]
    if not retried:
        return []
    return [
        Warning(
            f"The cache {alias!r} retries commands that timed out: a stalled Redis costs each request two "
            "timeouts, and runs the command twice when it wakes up (a request counted twice).",
            hint="Retry only a broken connection: 'CONNECTION_POOL_KWARGS': {'retry': Retry(NoBackoff(), 1, "
            "supported_errors=(redis.ConnectionError,))} (from redis.retry and redis.backoff), without "
            "retry_on_error or retry_on_timeout.",
            id="ratelimit_app.W003",
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
