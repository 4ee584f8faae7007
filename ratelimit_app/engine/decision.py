"""The one call to Redis on the request path: decide every applicable policy of a request in a single
Lua script (lua/decide.lua, assembled by scripts.py)."""

from __future__ import annotations

from time import monotonic, perf_counter
from typing import Sequence

import redis
from asgiref.sync import sync_to_async

from ..drivers import Io, Steps, arun, steps
from ..values import NO_POLICIES, Check, Verdict, splits
from . import keys
from .arguments import Ask, entry, script_call
from .circuit import Attempt, breaker
from .aclients import aclient
from .clients import cluster_configured, is_cluster
from .decision_connection import decision_client
from .hooks import hooks
from .scripts import scripts
from .shards import decide_on_cluster
from .verdicts import CounterAbsent, verdict_of

_made = tuple.__new__


def decide(checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False,
           cost: int = 1, lease: str = "") -> Verdict:
    """Decide every check in one Redis round trip (one per shard on a cluster); nothing counts if an enforcing
    policy denies. `lease` names a request's in-flight places, `now` replaces Redis' clock (tests), `dry_run`
    counts nothing, `version` brings the policy version back too. Raises RedisUnavailable."""
    return deciding.sync(checks, now=now, dry_run=dry_run, version=version, cost=cost, lease=lease)


async def adecide(
    checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False,
    cost: int = 1, lease: str = "",
) -> Verdict:
    """decide() for async code: the same steps, through redis-py's asyncio client. On Redis Cluster,
    the call runs in a worker thread with the cluster client (no asyncio cluster client is kept)."""
    return await arun(deciding(checks, now=now, dry_run=dry_run, version=version, cost=cost, lease=lease))


@steps
def deciding(checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False,
             cost: int = 1, lease: str = "") -> Steps[Verdict]:
    """decide() as plain steps, for a door's steps to `yield from`: the request's one driver runs them (a
    driver of its own per decision cost every request a generator, a loop and a StopIteration more).
    The script's call, and once more from the usage the database saved when a quota's period is one
    Redis does not hold."""
    if not checks:
        return NO_POLICIES
    # made directly: Ask(...) runs the named tuple's Python __new__ (its defaults) on every decision
    call = _made(Ask, (now, dry_run, cost, lease, None, False)) if cost == 1 else \
        Ask(now, dry_run, cost, lease, split=splits(checks, cost))
    started = perf_counter()
    seeds: dict = {}
    while True:
        try:
            verdict = yield Io(_send, _asend, (checks, call, version))
            break
        except CounterAbsent as absent:
            # on a cluster each shard reports its own absent counters, one shard a call: ask until none is
            # left (a counter given its saved usage is never absent again, so once per quota at most)
            if all((check.policy.id, check.subject.key) in seeds for check in absent.checks):
                raise
            seeds.update((yield Io(_saved, _asaved, (absent.checks, absent.now_ms))))
            call = call._replace(seeds=dict(seeds))
    hooks.decided(perf_counter() - started)
    return verdict


def _saved(checks: Sequence[Check], now_ms: int) -> dict:
    # the usage the layer that keeps it saved (quotas.py sets the hook): read below the engine's own frame
    return hooks.saved_usage(checks, now_ms)


async def _asaved(checks: Sequence[Check], now_ms: int) -> dict:
    return await sync_to_async(_saved)(checks, now_ms)


def _send(checks: Sequence[Check], call: Ask, version: bool) -> Verdict:
    # the client is made inside the breaker's attempt: it connects as it is made, and that may fail too
    if breaker.open_until:  # after an outage: refused at once, or the half-open circuit's probe
        with Attempt(breaker):
            return _decide(decision_client(), checks, call, version)
    try:  # the closed circuit, Attempt's work written out: no object a request
        verdict = _decide(decision_client(), checks, call, version)
    except redis.RedisError as error:
        breaker._failed(error)  # raises
        raise
    if breaker.open_until:  # opened by another call meanwhile: this answer closes it
        breaker._closed()
    return verdict


def _decide(redis_client: redis.Redis, checks: Sequence[Check], call: Ask, version: bool) -> Verdict:
    if not is_cluster(redis_client):
        # a single server does not check slots: every shard's keys go in one call, with the version
        script_keys, args, parts = script_call(checks, call, version)
        asked = monotonic()  # Redis's time in the reply is after this: a step of its clock shows (server_clock)
        return verdict_of(checks, scripts.get(entry(call), redis_client)(script_keys, args, redis_client), call, parts,
                          asked)
    verdict = decide_on_cluster(redis_client, checks, call)
    if version:  # the version key lives in a slot of its own
        verdict = verdict._replace(version=redis_client.get(keys.version_key()) or b"")
    return verdict


async def _asend(checks: Sequence[Check], call: Ask, version: bool) -> Verdict:
    if cluster_configured():
        return await sync_to_async(_send, thread_sensitive=False)(checks, call, version)
    redis_client = aclient()
    script = scripts.get(entry(call), redis_client)
    script_keys, args, parts = script_call(checks, call, version)
    asked = monotonic()
    if breaker.open_until:  # after an outage: refused at once, or the half-open circuit's probe
        with Attempt(breaker):
            reply = await script(script_keys, args, redis_client)
    else:  # the closed circuit, as _send's: no object a request
        try:
            reply = await script(script_keys, args, redis_client)
        except redis.RedisError as error:
            breaker._failed(error)  # raises
            raise
        if breaker.open_until:  # opened by another call meanwhile: this answer closes it
            breaker._closed()
    return verdict_of(checks, reply, call, parts, asked)
