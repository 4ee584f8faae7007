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
def check_metrics(app_configs: object = None, **kwargs: object) -> list:
    from . import metrics

    if get_setting("RATELIMIT_METRICS") and metrics.prometheus_client is None:
        return [
            Warning(
                "RATELIMIT_METRICS is True but prometheus_client is not installed: no metric is recorded.",
                hint="pip install prometheus_client, or remove RATELIMIT_METRICS.",
                id="ratelimit_app.W003",
            )
        ]
    return []
