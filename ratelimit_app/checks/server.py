"""A deployment check that asks the Redis server itself (W010): whether it may evict the limiter's counters.
Only `check --deploy` and `ratelimit status` run it, so `check`, `migrate` and `runserver` never wait on Redis."""

from __future__ import annotations

from typing import NamedTuple

import redis
from django.conf import settings
from django.core.checks import Tags, Warning, register
from redis.exceptions import RedisClusterException

from ..conf import get_setting


class Eviction(NamedTuple):
    """A server of the limiter's cache that may evict its keys: its address and what it says."""

    server: str
    policy: str
    maxmemory: int | None  # bytes; None: the server did not say (a managed service's INFO may leave it out)


def evictions() -> list[Eviction]:
    """The servers of RATELIMIT_CACHE whose maxmemory-policy may evict the limiter's keys; [] when none may,
    and when they cannot be asked (unreachable, or both CONFIG and INFO refused): a check never fails for it."""
    from ..engine import RedisUnavailable, admin_call

    cache = settings.CACHES.get(get_setting("RATELIMIT_CACHE"), {})
    if not cache.get("BACKEND", "").startswith("django_redis."):
        return []  # E001/E002 say so
    try:
        found = admin_call(lambda client: [(where, _memory_policy(server)) for where, server in _servers(client)])
    except (RedisUnavailable, RedisClusterException):  # the admin's short timeout bounds the wait
        return []
    return [Eviction(where, policy, maxmemory) for where, (policy, maxmemory) in found if _evicts(policy, maxmemory)]


def _servers(client: object) -> list[tuple[str, redis.Redis]]:
    """The servers that hold counters: each master of a cluster, else the one the client reaches."""
    from ..engine import is_cluster

    if is_cluster(client):
        return [(node.name, client.get_redis_connection(node)) for node in client.get_primaries()]
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    # Sentinel's: the master it names now (the admin's own pool connects through Sentinel's)
    service = getattr(kwargs.get("connection_pool", pool), "service_name", None)
    where = (f"{service} (Sentinel's master)" if service else kwargs.get("path")
             or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}")
    return [(where, client)]


def _memory_policy(server: redis.Redis) -> tuple[str, int | None]:
    """(maxmemory-policy, maxmemory) by CONFIG GET, or by INFO where CONFIG is refused (an ACL user without
    it, a managed service that renamed it): INFO's memory section carries both on Redis 4 and later."""
    try:
        config = server.config_get("maxmemory*")
        return str(config.get("maxmemory-policy", "")), int(config.get("maxmemory", 0))
    except redis.ResponseError:
        pass
    info = server.info("memory")
    maxmemory = info.get("maxmemory")
    return str(info.get("maxmemory_policy", "")), None if maxmemory is None else int(maxmemory)


def _evicts(policy: str, maxmemory: int | None) -> bool:
    # without maxmemory Redis evicts nothing whatever the policy; every counter has an expiry, so the
    # volatile-* policies may take them as surely as allkeys-* ones
    return policy not in ("", "noeviction") and maxmemory != 0


def _human(maxmemory: int | None) -> str:
    if maxmemory is None:
        return "maxmemory set"
    return f"maxmemory {maxmemory / 2**20:g} MB" if maxmemory >= 2**20 else f"maxmemory {maxmemory} bytes"


def eviction_warning(eviction: Eviction) -> Warning:
    which = "keys with an expiry (every counter has one)" if eviction.policy.startswith("volatile-") else "any key"
    return Warning(
        f"The Redis at {eviction.server} evicts {which} once full ({_human(eviction.maxmemory)}, "
        f"maxmemory-policy {eviction.policy}): a counter it evicts starts again from zero, and its subject is "
        "admitted past its limit without any error.",
        hint="Keep the counters on a Redis of their own with maxmemory-policy noeviction (and a maxmemory that "
             "fits them), apart from the site's cache; see the deployment guide.",
        id="ratelimit_app.W010",
    )


@register(Tags.caches, deploy=True)
def check_eviction(app_configs: object = None, **kwargs: object) -> list:
    return [eviction_warning(eviction) for eviction in evictions()]
