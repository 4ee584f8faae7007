"""The one call to Redis on the request path: decide every applicable policy of a request in a single
Lua script (lua/decide.lua, assembled by scripts.py)."""

from __future__ import annotations

from time import perf_counter
from typing import Sequence

import redis
from asgiref.sync import sync_to_async

from .. import quotas
from ..values import NO_POLICIES, Check, Verdict
from . import giveback, keys
from .arguments import Ask, script_call
from .circuit import breaker
from .aclients import aclient
from .clients import cluster_configured, is_cluster
from .decision_connection import decision_client
from .hooks import hooks
from .scripts import scripts
from .shards import decide_on_cluster
from .verdicts import verdict_of


def decide(checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False,
           cost: int = 1, lease: str = "") -> Verdict:
    """Decide every check in one Redis round trip (one per shard on a cluster); nothing counts if an enforcing
    policy denies. `lease` names a request's in-flight places, `now` replaces Redis' clock (tests), `dry_run`
    counts nothing, `version` brings the policy version back too. Raises RedisUnavailable."""
    if not checks:
        return NO_POLICIES
    started = perf_counter()
    # the client is made inside the breaker's call: it connects as it is made, and that may fail too
    call = Ask(now, dry_run, cost, lease)
    try:
        verdict = breaker.call(lambda: _decide(giveback.cleared(decision_client()), checks, call, version))
    except quotas.QuotaAbsent as absent:  # a period Redis does not hold: from the usage saved for it
        call = call._replace(seeds=quotas.saved(absent.checks, absent.now_ms))
        verdict = breaker.call(lambda: _decide(giveback.cleared(decision_client()), checks, call, version))
    hooks.decided(perf_counter() - started)
    return verdict


def _decide(redis_client: redis.Redis, checks: Sequence[Check], call: Ask, version: bool) -> Verdict:
    if not is_cluster(redis_client):
        # a single server does not check slots: every shard's keys go in one call, with the version
        script_keys, args = script_call(checks, call, version)
        return verdict_of(checks, scripts.get("decide", redis_client)(script_keys, args, redis_client), call)
    verdict = decide_on_cluster(redis_client, checks, call)
    if version:  # the version key lives in a slot of its own
        verdict = verdict._replace(version=redis_client.get(keys.version_key()) or b"")
    return verdict


async def adecide(
    checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False,
    cost: int = 1, lease: str = "",
) -> Verdict:
    """decide() for async code: the same script and keys, through redis-py's asyncio client.

    On Redis Cluster, decide() runs in a worker thread with the cluster client (no asyncio cluster
    client is kept): the same calls, the same guarantees.
    """
    if not checks:
        return NO_POLICIES
    if cluster_configured():
        return await sync_to_async(decide, thread_sensitive=False)(
            checks, now=now, dry_run=dry_run, version=version, cost=cost, lease=lease
        )
    call = Ask(now, dry_run, cost, lease)
    redis_client = aclient()
    script = scripts.get("decide", redis_client)
    started = perf_counter()
    script_keys, args = script_call(checks, call, version)
    reply = await breaker.acall(lambda: script(script_keys, args, redis_client))
    try:
        verdict = verdict_of(checks, reply, call)
    except quotas.QuotaAbsent as absent:  # a period Redis does not hold: from the usage saved for it
        call = call._replace(seeds=await sync_to_async(quotas.saved)(absent.checks, absent.now_ms))
        script_keys, args = script_call(checks, call, version)
        reply = await breaker.acall(lambda: script(script_keys, args, redis_client))
        verdict = verdict_of(checks, reply, call)
    hooks.decided(perf_counter() - started)
    return verdict
