"""The one call to Redis on the request path: decide every applicable policy of a request in a single
Lua script (lua/decide.lua, assembled by scripts.py)."""

from __future__ import annotations

from time import perf_counter, time
from typing import NamedTuple, Sequence

import redis
from asgiref.sync import sync_to_async

from . import giveback, keys, metrics, quotas
from .breaker import RedisUnavailable, breaker
from .connection import aclient, cluster_configured, is_cluster
from .decision_connection import decision_client
from .scripts import now_arg, run_each, scripts
from .giveback import arelease, release  # noqa: F401 (tools and tests give places back through the engine)
from .tally import BLOCKED, tally
from .values import NO_POLICIES, Check, CompiledPolicy, Decision, Held, Subject, Verdict


__all__ = ["Check", "Decision", "Verdict", "NO_POLICIES", "RedisUnavailable", "decide", "adecide", "live_member"]




# --- deciding ----------------------------------------------------------------------------------


def decide(checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False, version: bool = False,
           cost: int = 1, lease: str = "") -> Verdict:
    """Decide every check in one Redis round trip; nothing is counted if an enforcing policy denies.

    `cost`: the units the request takes from every policy; `lease`: what in-flight policies name
    the request's places after (limiter.lease_of), '' when none applies.
    `now` (seconds since the epoch) replaces the server's clock, for tests; `dry_run` decides
    without counting anything; `version` brings the policy version back in the same call (the
    doors ask for it when their worker is due to compare). On Redis Cluster, checks whose subjects
    live in different shards take one call per shard (_decide_across_shards) and the version is
    read beside them. Raises RedisUnavailable when Redis cannot answer.
    """
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
    metrics.record_call(perf_counter() - started)
    return verdict


class Ask(NamedTuple):
    """What one decide call says beside its checks."""

    now: float | None
    dry_run: bool
    cost: int
    lease: str
    # (policy id, subject key) -> (period start ms, used): what the database saved of quota periods
    # that Redis did not hold (asked again after the script said so)
    seeds: dict | None = None


def _decide(redis_client: redis.Redis, checks: Sequence[Check], call: Ask, version: bool) -> Verdict:
    if not is_cluster(redis_client):
        # a single server does not check slots: every shard's keys go in one call, with the version
        script_keys, args = _script_call(checks, call, version)
        return _verdict(checks, scripts.get("decide", redis_client)(script_keys, args, redis_client), call)
    verdict = _decide_on_cluster(redis_client, checks, call)
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
    script = scripts.get_async("decide", redis_client)
    started = perf_counter()
    script_keys, args = _script_call(checks, call, version)
    reply = await breaker.acall(lambda: script(script_keys, args, redis_client))
    try:
        verdict = _verdict(checks, reply, call)
    except quotas.QuotaAbsent as absent:  # a period Redis does not hold: from the usage saved for it
        call = call._replace(seeds=await sync_to_async(quotas.saved)(absent.checks, absent.now_ms))
        script_keys, args = _script_call(checks, call, version)
        reply = await breaker.acall(lambda: script(script_keys, args, redis_client))
        verdict = _verdict(checks, reply, call)
    metrics.record_call(perf_counter() - started)
    return verdict


def _script_call(checks: Sequence[Check], call: Ask, version: bool) -> tuple[list[str], list[str]]:
    """The KEYS and ARGV of decide.lua for these checks (`version`: bring the policy version back too;
    never on a cluster, where the version lives in another slot)."""
    key_prefix = keys.prefix()
    script_keys: list[str] = []
    args = [("d" if call.dry_run else "") + now_arg(call.now), str(_sent_cost(checks, call.cost)), call.lease]
    shard_count = keys.shards()  # part of the keys: a changed setting makes new parts
    for policy, subject, limit, plan in checks:
        parts = policy.script_parts.get((subject, limit, plan, key_prefix, shard_count))
        if parts is None:
            parts = _check_parts(policy, subject, limit, plan, key_prefix, shard_count)
        script_keys.append(parts[0])
        if policy.period:  # a calendar quota's terms carry its periods, which move on
            args.append(_quota_terms(policy, subject, limit, parts[4], call))
        else:
            args.append(parts[5] if parts[4] else parts[1])
    if version:
        script_keys.append(keys.version_key(key_prefix))
    return script_keys, args


def _quota_terms(policy: CompiledPolicy, subject: Subject, limit: int, look_first: bool, call: Ask) -> str:
    now_ms = int((time() if call.now is None else call.now) * 1000)
    seed = call.seeds.get((policy.id, subject.key)) if call.seeds else None
    enforce = "1" if policy.enforce else "0"
    return (
        f"{policy.strategy} {limit} {policy.window_ms} {quotas.bucket(policy, now_ms, seed)} {enforce} "
        f"{policy.totals_bucket_ms} {'1' if look_first else '0'}"
    )


def _sent_cost(checks: Sequence[Check], cost: int) -> int:
    """The cost as the script is asked to take it: a cost above every policy's capacity is refused by
    each of them whatever its size, so it is sent as one more than the largest capacity, which keeps
    the script's work and arithmetic bounded by the policies' own figures (the verdict keeps the real cost)."""
    if cost == 1:
        return 1
    return min(cost, max(check.policy.capacity(check.limit) for check in checks) + 1)


MAX_PARTS = 4096  # (subject, limit, plan) whose script parts a policy keeps


def _check_parts(
    policy: CompiledPolicy, subject: Subject, limit: int, plan: str, key_prefix: str, shard_count: int
) -> list:
    """What one check adds to decide.lua's call (its counter, its terms) and what the worker's tally
    writes for it (its live index entry, its shard), kept on the compiled policy for next time; with
    whether the subject was refused at its last decision here, when the terms that look first are sent."""
    terms = policy_terms(policy, limit)
    parts = [
        keys.counter_key(policy, subject.key, key_prefix),
        terms + " 0",
        live_member(subject, limit, policy, plan),
        keys.shard_of(subject.key),
        False,
        terms + " 1",
    ]
    if len(policy.script_parts) >= MAX_PARTS:
        policy.script_parts.clear()  # bounded: a flood of new subjects only costs building them again
    policy.script_parts[(subject, limit, plan, key_prefix, shard_count)] = parts
    return parts


# --- Redis Cluster: one call per shard group ------------------------------------------------------


def _decide_on_cluster(redis_client, checks: Sequence[Check], call: Ask) -> Verdict:
    groups: dict[int, list[Check]] = {}
    for check in checks:
        groups.setdefault(keys.shard_of(check.subject.key), []).append(check)
    if len(groups) == 1:
        return _pipelined(redis_client, groups, call)[next(iter(groups))]
    return _decide_across_shards(redis_client, checks, groups, call)


def _decide_across_shards(redis_client, checks: Sequence[Check], groups: dict[int, list[Check]], call: Ask) -> Verdict:
    """A cluster request whose subjects live in several shards: look, then count, one call per shard each time.

    First every shard is asked without counting (one pipeline: the shards' nodes answer in
    parallel). If an enforcing policy denies there, the request is denied and the other shards
    count nothing; the denying shards are asked once more, counting, so that the refusal reaches
    the live page (they deny again: an enforcing policy at its limit counts nothing). Otherwise
    every shard counts in one more pipeline; each shard still decides atomically, so a shard that
    filled up in between denies and the request is denied. Nothing is ever admitted over a limit;
    in those races a shard may have counted a request that was refused (an under-admission of
    one request, never an over-admission), but no in-flight place stays taken: a refused request
    gives back, by its lease, what the shards that admitted it took.
    """
    peeked = _pipelined(redis_client, groups, call._replace(dry_run=True))
    if call.dry_run:
        return _merged(checks, groups, peeked)
    denying = {shard: groups[shard] for shard, verdict in peeked.items() if not verdict.allowed}
    if denying:
        _refused_holds_nothing(redis_client, _pipelined(redis_client, denying, call), call)  # records the refusal
        return _merged(checks, groups, peeked)
    counted = _pipelined(redis_client, groups, call)
    verdict = _merged(checks, groups, counted)
    if not verdict.allowed:
        _refused_holds_nothing(redis_client, counted, call)
    return verdict


def _refused_holds_nothing(redis_client, verdicts: dict[int, Verdict], call: Ask) -> None:
    """The request is refused: the in-flight places that shards which admitted it took go back, by its
    lease (the worker keeps no places of a refused request)."""
    if call.lease:
        held = [Held(d.policy, d.subject, call.lease, call.cost) for verdict in verdicts.values() if verdict.allowed
                for d in verdict.decisions if d.policy.holds and not d.exceeded]
        if held:
            giveback.send(redis_client, held)


def _pipelined(redis_client, groups: dict[int, list[Check]], call: Ask) -> dict[int, Verdict]:
    """One decide call per shard group, sent in one pipeline (on a cluster: to each node at once)."""
    script = scripts.get("decide", redis_client)
    calls = [_script_call(group, call, False) for group in groups.values()]
    replies = run_each(redis_client, script, calls)
    return {shard: _verdict(group, reply, call) for (shard, group), reply in zip(groups.items(), replies)}


def _merged(checks: Sequence[Check], groups: dict[int, list[Check]], verdicts: dict[int, Verdict]) -> Verdict:
    """One verdict for the request, its decisions in the order of `checks`."""
    decided = {}
    for shard, group in groups.items():
        decided.update(zip(map(id, group), verdicts[shard].decisions))
    decisions = tuple(decided[id(check)] for check in checks)
    return Verdict(all(verdict.allowed for verdict in verdicts.values()), decisions, None)


def _verdict(checks: Sequence[Check], reply: list, call: Ask) -> Verdict:
    now_ms, cost = reply[0], call.cost
    if now_ms < 0:  # the call read no clock (a fixed window's repeat): its window ends by this worker's
        now_ms = int(time() * 1000)
    decisions = []
    # the script leaves the totals and the live index to the worker (tally.py)
    admitted, refused, seen = [], [], []
    denied = False
    # a quota without its counter: refused (a negative count) with the retry ABSENT
    absent = [check for i, check in enumerate(checks) if reply[1 + 3 * i] < 0 and reply[3 + 3 * i] == quotas.ABSENT]
    if absent:
        raise quotas.QuotaAbsent(absent, now_ms)
    for i, (policy, subject, limit, plan) in enumerate(checks):
        count, reset_ms, third = reply[1 + 3 * i : 4 + 3 * i]
        exceeded = count < 0  # then -1 - count, and the third figure is the retry time, else the reset before
        if exceeded:
            count, retry_ms, before_ms = -1 - count, third, -2
        else:
            retry_ms, before_ms = 0, third
        if reset_ms < 0 or retry_ms < 0:  # the call read no clock: the window or period ends by ours
            ends_in = quotas.periods(policy, now_ms).end - now_ms if policy.period else policy.window_ms - now_ms % policy.window_ms
            reset_ms = ends_in if reset_ms < 0 else reset_ms
            retry_ms = ends_in if retry_ms < 0 else retry_ms
        allowed = not (exceeded and policy.enforce)
        denied = denied or not allowed
        capacity = policy.capacity(limit)  # a token bucket's count is compared with its burst
        retry_after = retry_ms / 1000 if exceeded and cost <= policy.largest_cost(limit) else None  # None: never fits
        # positional: this runs for every policy of every request
        decisions.append(
            Decision(
                policy, subject, allowed, bool(exceeded), count, limit,
                capacity - count if count < capacity else 0, reset_ms / 1000, retry_after, cost,
            )
        )
        if policy.period:  # the period the counter ends with: its length for `w`, its start for the database
            period = quotas.periods(policy, now_ms + max(reset_ms, retry_ms, 1) - 1)
            decisions[-1] = decisions[-1]._replace(window=(period.end - period.start) // 1000)
            if not call.dry_run:
                quotas.saver.record(policy, subject.key, subject.display, period.start, count)
        if not call.dry_run:
            seen.append((policy, subject, limit, plan, exceeded, count, reset_ms, before_ms))
    if seen:
        _tally(seen, denied, now_ms, cost)
    asked = 1 + 3 * len(checks)  # the version follows the figures when it was asked for
    return Verdict(not denied, tuple(decisions), reply[asked] if len(reply) > asked else None)


def _tally(seen: list, denied: bool, now_ms: int, cost: int) -> None:
    """Hand the worker's tally what the decision counted and refused (the totals), where each subject
    stands (the live index) and where its counter now empties (the count of active subjects).

    A subject's index entry is written when its meaning changes: the counter empties in another
    totals bucket, the subject is refused or admitted again after a refusal, or its count reaches
    2, 4, 8, ... (log2 of the limit writes a window), so a busy subject costs the index little."""
    counts, entries, moves = [], [], []
    key_prefix, shard_count = keys.prefix(), keys.shards()
    for policy, subject, limit, plan, exceeded, count, reset_ms, before_ms in seen:
        parts = policy.script_parts.get((subject, limit, plan, key_prefix, shard_count))
        if parts is None:
            parts = _check_parts(policy, subject, limit, plan, key_prefix, shard_count)
        refused_before, parts[4] = parts[4], bool(exceeded)  # the next decision looks before it writes
        # a policy over its limit refuses (a shadow one: would have) even when another denied first;
        # every policy below its limit counted the request unless one denied it
        if denied and not exceeded:
            continue
        member, shard = parts[2], parts[3]
        bucket = policy.totals_bucket_ms
        counts.append((policy, shard, "d" if exceeded else "a", now_ms // bucket))
        after = -(-(now_ms + reset_ms) // bucket)  # the totals bucket in which the counter empties
        if exceeded:
            if not refused_before:
                entries.append((policy, shard, member, BLOCKED + after * bucket))
            continue
        moved = before_ms == -1
        if moved:
            moves.append((policy, shard, after, 1))
        elif before_ms >= 0:
            before = -(-(now_ms + before_ms) // bucket)
            if before != after:
                moved = True
                moves += [(policy, shard, after, 1), (policy, shard, before, -1)]
        power = 1 << (count.bit_length() - 1)  # the highest power of 2 the count reached
        if moved or refused_before or 2 <= power > count - cost:
            # busier subjects score a little higher among those emptying together (log2 / 64, under 1 ms)
            entries.append((policy, shard, member, after * bucket + min(63, count.bit_length() - 1) / 64))
    tally.add(counts, entries, moves)


def policy_terms(policy: CompiledPolicy, limit: int) -> str:
    """A policy's terms as decide.lua reads them, but for the last (whether to look first): the same
    for every subject at `limit`."""
    enforce = "1" if policy.enforce else "0"
    return f"{policy.strategy} {limit} {policy.window_ms} {policy.bucket_ms} {enforce} {policy.totals_bucket_ms}"


def live_member(subject: Subject, limit: int, policy: CompiledPolicy, plan: str = "") -> str:
    """The live index entry of a subject: '<hash> <limit>[*|@plan] <display>', '*' marking an
    override's limit, '@plan' the limit of the subject's plan (a slug: no space)."""
    mark = f"@{plan}" if plan else ("*" if limit != policy.limit else "")
    return f"{subject.key} {limit}{mark} {subject.display}"
