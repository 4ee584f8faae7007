"""Redis Cluster: a request's checks grouped by shard, one decide call per group, sent in one pipeline
(the shards' nodes answer in parallel)."""

from __future__ import annotations

from time import monotonic
from typing import Sequence

import redis
from redis.exceptions import RedisClusterException

from ..values import Check, Held, Verdict, charge
from . import giveback, keys
from .arguments import Ask, entry, script_call
from .batches import run_each
from .scripts import scripts
from .verdicts import CounterAbsent, verdict_of


def decide_on_cluster(redis_client, checks: Sequence[Check], call: Ask) -> Verdict:
    groups: dict[int, list[Check]] = {}
    for check in checks:
        groups.setdefault(keys.shard_of(check.subject.key), []).append(check)
    if len(groups) == 1:
        return _pipelined(redis_client, groups, call)[next(iter(groups))]
    return _decide_across_shards(redis_client, checks, groups, call)


def _decide_across_shards(
    redis_client, checks: Sequence[Check], groups: dict[int, list[Check]], call: Ask
) -> Verdict:
    """A cluster request whose subjects live in several shards: look, then count, one call per shard each time.

    First every shard is asked without counting (one pipeline: the shards' nodes answer in
    parallel). If an enforcing policy denies there, the request is denied and the other shards
    count nothing; the denying shards are asked once more, counting, so that the refusal reaches
    the live page (they deny again: an enforcing policy at its limit counts nothing). Otherwise
    every shard counts in one more pipeline; each shard still decides atomically, so a shard that
    filled up in between denies and the request is denied. Nothing is ever admitted over a limit;
    in those races a shard may have counted a request that was refused, or that is decided again
    (a quota's counter lost since the look: asked again with its saved usage): an under-admission
    of one request, never an over-admission. No in-flight place stays taken: a refused request, or
    one decided again, gives back by its lease what the shards that admitted it took.

    A shard that cannot answer (TRYAGAIN while its slot moves, a lost answer) leaves the request
    undecided, unless a shard that answered denies it: then it is denied, its verdict carrying the
    decisions of the shards that answered.
    """
    peeked = _pipelined(redis_client, groups, call._replace(dry_run=True), raise_on_error=False)
    denying = _denying(peeked, groups)
    if call.dry_run or not denying:
        _raise_first(peeked)
    if call.dry_run:
        return _merged(checks, groups, peeked)
    if denying:
        # records the refusal (a denying shard that cannot answer now recorded nothing)
        recorded = _pipelined(redis_client, denying, call, raise_on_error=False)
        _give_back(redis_client, recorded, call, denying)
        return _merged(checks, groups, peeked)
    counted = _pipelined(redis_client, groups, call, raise_on_error=False)
    if not _denying(counted, groups):
        for verdict in counted.values():
            if isinstance(verdict, Exception) and not isinstance(verdict, CounterAbsent):
                raise verdict  # what the shards that answered took stays the request's, given back at its end
        if any(isinstance(verdict, CounterAbsent) for verdict in counted.values()):
            # the call is made again under the same lease, with the saved usage: what the shards that
            # admitted took goes back first, taken by Redis before that (never owed: it would free the new places)
            _give_back(redis_client, counted, call, groups, owe=False)
            _raise_first(counted)
    verdict = _merged(checks, groups, counted)
    if not verdict.allowed:
        _give_back(redis_client, counted, call, groups)
    return verdict


def _denying(verdicts: dict[int, Verdict | Exception], groups: dict[int, list[Check]]) -> dict[int, list[Check]]:
    """The shards that answered with a denial, with their checks."""
    return {shard: groups[shard] for shard, verdict in verdicts.items()
            if isinstance(verdict, Verdict) and not verdict.allowed}


def _give_back(redis_client, verdicts: dict[int, Verdict | Exception], call: Ask,
               groups: dict[int, list[Check]], owe: bool = True) -> None:
    """The request is refused (or made again): the in-flight places that shards which admitted it took go
    back, by its lease (the worker keeps no places of a refused request); a shard whose answer is lost may
    have taken them too (giving back a place never taken changes nothing). A shard whose quota was absent
    ran nothing. When Redis cannot take them now, they are owed (`owe`: the refusal stands), or the error
    is raised."""
    if not call.lease:
        return
    held = []
    for shard, verdict in verdicts.items():
        if isinstance(verdict, CounterAbsent):
            continue
        if isinstance(verdict, Exception):
            held += [Held(c.policy, c.subject, call.lease, charge(c.policy, call.cost, call.split))
                     for c in groups[shard] if c.policy.holds]
        elif verdict.allowed:
            held += [Held(d.policy, d.subject, call.lease, d.cost) for d in verdict.decisions
                     if d.policy.holds and not d.exceeded]
    if held:
        try:
            giveback.send(redis_client, held, strict=not owe)
        except (redis.RedisError, RedisClusterException, OSError) as error:
            if not owe:
                raise
            giveback.owed.add(held, error)


def _pipelined(redis_client, groups: dict[int, list[Check]], call: Ask,
               raise_on_error: bool = True) -> dict[int, Verdict | Exception]:
    """One decide call per shard group, sent in one pipeline (on a cluster: to each node at once); with
    `raise_on_error` False, a shard's error (or its quotas' absent counters) is its entry."""
    script = scripts.get(entry(call), redis_client)
    calls = [script_call(group, call, False) for group in groups.values()]
    asked = monotonic()
    replies = run_each(redis_client, script, [(script_keys, args) for script_keys, args, _ in calls], raise_on_error)
    verdicts: dict[int, Verdict | Exception] = {}
    for (shard, group), reply, (_, _, parts) in zip(groups.items(), replies, calls):
        try:
            verdicts[shard] = reply if isinstance(reply, Exception) else verdict_of(
                group, reply, _read_as(call, group), parts, asked)
        except CounterAbsent as absent:
            if raise_on_error:
                raise
            verdicts[shard] = absent
    return verdicts


def _read_as(call: Ask, group: list[Check]) -> Ask:
    """The call as one shard's reply is read: a shard holding only policies counting requests of a request
    charged in each policy's own unit took one request (sent as such by script_call), read as a call of cost 1."""
    if call.split and not any(check.policy.meters for check in group):
        return call._replace(cost=1, split=False)
    return call


def _raise_first(verdicts: dict[int, Verdict | Exception]) -> None:
    """Raise a shard's error; the quotas' absent counters of every shard first, in one CounterAbsent (asked
    again at once with their saved usage)."""
    errors = [verdict for verdict in verdicts.values() if isinstance(verdict, Exception)]
    absent = [error for error in errors if isinstance(error, CounterAbsent)]
    if absent:
        raise CounterAbsent([check for error in absent for check in error.checks], absent[0].now_ms)
    if errors:
        raise errors[0]


def _merged(
    checks: Sequence[Check], groups: dict[int, list[Check]], verdicts: dict[int, Verdict | Exception]
) -> Verdict:
    """One verdict for the request, its decisions in the order of `checks`: those of the shards that
    answered (a request that a shard denied is denied whatever another could not say)."""
    decided = {}
    for shard, group in groups.items():
        if isinstance(verdicts[shard], Verdict):
            decided.update(zip(map(id, group), verdicts[shard].decisions))
    decisions = tuple(decided[id(check)] for check in checks if id(check) in decided)
    allowed = all(isinstance(v, Verdict) and v.allowed for v in verdicts.values())
    metered = tuple(m for v in verdicts.values() for m in v.metered) if allowed else ()
    return Verdict(allowed, decisions, None, metered)
