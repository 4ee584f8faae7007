"""The Lua scripts, read from lua/*.lua and assembled once: the shared pieces (series.lua,
activity.lua), one file per strategy, then an entry point (decide.lua, live.lua, totals.lua).

redis-py's Script does EVALSHA and reloads a script by itself after NOSCRIPT.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Sequence

import redis
import redis.asyncio
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError, RedisClusterException

from .connection import is_cluster

if TYPE_CHECKING:
    from .policies import CompiledPolicy

LIBRARY_FILES = ("series.lua", "activity.lua")
STRATEGY_FILES = ("fixed_window.lua", "sliding_window.lua", "sliding_log.lua", "token_bucket.lua")
ENTRY_POINTS = ("decide", "live", "totals", "trend", "tally")
TOTALS_BUCKETS = 60  # at most this many buckets in a policy's totals


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text(encoding="utf-8")


def _assemble(entry: str) -> str:
    parts = ["local strategies = {}"] + [_lua(name) for name in LIBRARY_FILES + STRATEGY_FILES] + [_lua(entry)]
    return "\n".join(parts)


class _Scripts:
    """The Script objects, created once with the first client (a Script only needs one for its SHA)."""

    def __init__(self) -> None:
        self._sources = {name: _assemble(f"{name}.lua") for name in ENTRY_POINTS}
        self._scripts: dict[str, Script] = {}
        self._async_scripts: dict[str, AsyncScript] = {}

    def get(self, name: str, client: redis.Redis) -> Script:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = client.register_script(self._sources[name])
        return script

    def get_async(self, name: str, client: redis.asyncio.Redis) -> AsyncScript:
        """The same script for redis-py's asyncio client (pass the client of the running loop at call time)."""
        script = self._async_scripts.get(name)
        if script is None:
            script = self._async_scripts[name] = client.register_script(self._sources[name])
        return script


scripts = _Scripts()


def now_arg(now: float | None) -> str:
    """A caller's `now` (seconds) as the scripts take it: integer milliseconds, or '' for Redis TIME."""
    return "" if now is None else str(int(now * 1000))


def run_each(client: redis.Redis, script: Script, calls: Sequence[tuple[Sequence[str], Sequence]]) -> list:
    """Run `script` once per (keys, args) in one pipeline (on a cluster: every node at once); the replies in order.

    A server that restarted or took over from a failed master may lack the script: it is loaded and
    only the calls that met NOSCRIPT are sent again (such a call ran nothing, so nothing counts twice).
    Raises the first Redis error of any call.
    """
    # On a cluster, name each call's node (from the client's own slot map): otherwise the pipeline asks
    # a server COMMAND GETKEYS for every script call, one more round trip each.
    node_of = client.get_node_from_key if is_cluster(client) else None

    def send(indexes: list[int]) -> list:
        with client.pipeline(transaction=False) as pipe:
            for i in indexes:
                keys, args = calls[i]
                # execute_command: a cluster pipeline refuses its evalsha() method, not the command itself
                options = {"target_nodes": node_of(keys[0])} if node_of else {}
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **options)
            return pipe.execute(raise_on_error=False)

    try:
        replies = send(list(range(len(calls))))
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            client.script_load(script.script)
            for i, reply in zip(missing, send(missing)):
                replies[i] = reply
    except RedisClusterException as error:  # e.g. a slot no node serves, mid-failover: an outage, not a bug
        raise redis.ConnectionError(f"Redis Cluster: {error}") from error
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def totals_bucket_ms(policy: CompiledPolicy) -> int:
    return _totals_bucket_ms(policy.strategy, policy.window_ms, policy.bucket_ms)


@lru_cache(maxsize=256)  # asked for every policy of every request
def _totals_bucket_ms(strategy: str, window_ms: int, bucket_ms: int) -> int:
    """The bucket of a policy's totals, so that they cover the window its counters use: the window
    of a fixed_window, the buckets of a sliding_window (whole groups of them past 60 buckets, so a
    read of the totals stays short); sliding_log and token_bucket have no buckets of their own:
    their totals slide in at most 60 steps (a window in ms always has 40 or 50 among its divisors).
    """
    if strategy == "fixed_window":
        return window_ms
    if strategy == "sliding_window":  # the policy's own buckets, grouped when there are over 60
        buckets = window_ms // bucket_ms
        return next(window_ms // count for count in range(min(buckets, TOTALS_BUCKETS), 0, -1) if buckets % count == 0)
    return next(window_ms // count for count in range(TOTALS_BUCKETS, 0, -1) if window_ms % count == 0)
