"""Counters read as they are now, with Redis's time, for a layer that keeps counts beyond Redis (the saved
quota usage): one script per slot, off the request path."""

from __future__ import annotations

from typing import Sequence

from ..values import CompiledPolicy
from . import keys
from .clients import client, is_cluster

# the counters' values and Redis's time, read at once (a script runs alone): what a settle moved is exact
READ = (
    "local t = redis.call('TIME') local out = {t[1], t[2]} "
    "for i, key in ipairs(KEYS) do out[i + 2] = redis.call('GET', key) or '' end return out"
)


def counters_now(counters: Sequence[tuple[CompiledPolicy, str]]) -> list[tuple[int, str | bytes]]:
    """The value of each (policy, subject)'s counter ('' where Redis has none) with the moment, in
    microseconds of Redis's clock, it held it; in the order asked. RedisError/OSError pass to the caller."""
    redis_client = client()
    cluster, prefix = is_cluster(redis_client), keys.prefix()
    groups: dict[int, list[tuple[int, str]]] = {}
    for place, (policy, subject) in enumerate(counters):
        counter = keys.counter_key(policy, subject, prefix)
        groups.setdefault(redis_client.keyslot(counter) if cluster else 0, []).append((place, counter))
    found: list[tuple[int, str | bytes]] = [(0, "")] * len(counters)
    for group in groups.values():
        reply = redis_client.eval(READ, len(group), *[counter for _, counter in group])
        at_us = int(reply[0]) * 1_000_000 + int(reply[1])
        for (place, _), value in zip(group, reply[2:]):
            found[place] = (at_us, value)
    return found
