"""System checks: misconfiguration is reported by `manage.py check`, not by a 500 later."""

from __future__ import annotations

import socket
from typing import Iterator, Sequence

import redis
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ValidationError
from django.db import DatabaseError, connections, transaction
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils.module_loading import import_string

from .conf import get_setting
from .models import Policy


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
    from .engine.clients import pool_retry, retries, uses_cluster_factory

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
    from .engine import cluster_configured

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


@register()
def check_code_costs(app_configs: object = None, **kwargs: object) -> list:
    """A fixed cost in code that cannot be used: not a whole number of at least 1 (a DRF view's
    `throttle_cost`), or above what an enforcing policy declared in code allows at once."""
    return _code_cost_errors(None)


@register(Tags.database)
def check_code_costs_against_rows(app_configs: object = None, databases: Sequence[str] | None = None,
                                  **kwargs: object) -> list:
    """The same against the policies' rows, with `--database` (and during migrate), once their table exists.
    Tagged: Django 6 hands every check the databases, and only a database check may read them."""
    by_code = _code_cost_errors(None)
    return [error for database in databases or () for error in _code_cost_errors(database) if error not in by_code]


def _code_cost_errors(database: str | None) -> list:
    from . import registry

    errors = [
        Error(f"{where} = {cost!r}: {problem}; a cost is a whole number of units, at least 1.",
              hint="Write e.g. throttle_cost = 3, or compute it per request in get_throttle_cost(self, request).",
              id="ratelimit_app.E018")
        for where, cost, problem in _unusable_view_costs()
    ]
    capacities = _enforcing_capacities(database)
    costs = _view_costs()
    for action, (cost, origin) in registry.code_costs().items():
        if action not in costs or costs[action][0] < cost:
            costs[action] = (cost, origin)
    for action, (cost, origin) in sorted(costs.items()):
        for name, allowed in capacities.get(action, ()):
            if cost > allowed:
                errors.append(Error(
                    f"{origin}: a request of {action!r} costs {cost} units, more than policy {name!r} "
                    f"allows at once ({allowed}): it could never be admitted.",
                    hint="Lower the cost, or raise the policy's limit (or burst).",
                    id="ratelimit_app.E018",
                ))
    return errors


def _enforcing_capacities(database: str | None) -> dict[str, list[tuple[str, int]]]:
    """action -> (policy name, what it admits at once) of the enabled, enforcing policies: the rows of
    `database` when it can be read, else (and for a declaration without its row) the code's values."""
    from . import registry
    from .models import Mode

    # a limit computed per request (create_only) is not known here
    found = {p.name: Policy(**p.values, name=p.name) for p in registry.declared_policies() if not p.create_only}
    rows = _readable_policies(database) if database else None
    found.update((row.name, row) for row in rows or ())
    capacities: dict[str, list[tuple[str, int]]] = {}
    for name, row in sorted(found.items()):
        if row.enabled and row.mode == Mode.ENFORCE:
            capacities.setdefault(row.action, []).append((name, row.capacity()[0]))
    return capacities


POLICY_COLUMNS = ("name", "action", "limit", "window", "strategy", "burst", "bucket_size", "enabled", "mode")


def _readable_policies(database: str) -> list | None:
    """The policies of `database`, or None when they cannot be read: migrate runs the checks before it
    creates (or changes) the table, and a check must never stop it."""
    table = Policy._meta.db_table
    try:
        if table not in connections[database].introspection.table_names():
            return None
        with transaction.atomic(using=database):  # a failed query must not break a transaction around the check
            return list(Policy.objects.using(database).only(*POLICY_COLUMNS))
    except DatabaseError:
        return None


def _routed_views(patterns, prefix: str = "") -> Iterator[tuple[object, str | None]]:
    """(view, URL name with its namespaces) of every route of the URLconf."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            namespace = f"{prefix}{pattern.namespace}:" if pattern.namespace else prefix
            yield from _routed_views(pattern.url_patterns, namespace)
        elif isinstance(pattern, URLPattern):
            yield pattern.callback, f"{prefix}{pattern.name}" if pattern.name else None


def _drf_views() -> Iterator[tuple[type, str | None]]:
    """The DRF views of the URLconf that a PolicyThrottle runs, with their URL names."""
    from .doors import is_policy_throttled

    try:
        patterns = get_resolver().url_patterns
    except Exception:  # noqa: BLE001 - Django's own check of the URLconf reports why it does not load
        return
    for view, url_name in _routed_views(patterns):
        view_class = getattr(view, "cls", None)
        if view_class is not None and is_policy_throttled(view_class):
            yield view_class, url_name


def _fixed_view_cost(view_class: type) -> object:
    """A DRF view's fixed `throttle_cost` (None: it sets none, or computes it per request)."""
    if callable(getattr(view_class, "get_throttle_cost", None)):
        return None
    return getattr(view_class, "throttle_cost", None)


def _unusable_view_costs() -> list[tuple[str, object, str]]:
    from .registry import fixed_cost_problem

    found = []
    for view_class, _url_name in _drf_views():
        cost = _fixed_view_cost(view_class)
        problem = None if cost is None else fixed_cost_problem(cost)
        if problem:
            found.append((f"{view_class.__module__}.{view_class.__qualname__}.throttle_cost", cost, problem))
    return sorted(set(found), key=lambda item: item[0])


def _view_costs() -> dict[str, tuple[int, str]]:
    """action -> (the largest usable fixed cost DRF views give it, where): by throttle_scope and URL name."""
    from .registry import fixed_cost_problem

    costs: dict[str, tuple[int, str]] = {}
    for view_class, url_name in _drf_views():
        cost = _fixed_view_cost(view_class)
        if cost is None or fixed_cost_problem(cost):
            continue
        where = f"{view_class.__module__}.{view_class.__qualname__}.throttle_cost"
        for action in (getattr(view_class, "throttle_scope", None), url_name):
            if action and (action not in costs or costs[action][0] < cost):
                costs[action] = (cost, where)
    return costs
