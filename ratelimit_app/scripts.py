"""The Lua scripts, read from lua/*.lua and assembled once: one file per strategy plus the entry points.

redis-py's Script does EVALSHA and reloads a script by itself after NOSCRIPT.
"""

from __future__ import annotations

from importlib import resources

import redis
import redis.asyncio
from redis.commands.core import AsyncScript, Script

STRATEGY_FILES = ("fixed_window.lua", "sliding_window.lua", "sliding_log.lua", "token_bucket.lua")


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text(encoding="utf-8")


def _assemble(entry: str) -> str:
    parts = ["local strategies = {}"] + [_lua(name) for name in STRATEGY_FILES] + [_lua(entry)]
    return "\n".join(parts)


class _Scripts:
    """The Script objects, created once with the first client (a Script only needs one for its SHA)."""

    def __init__(self) -> None:
        self._sources = {"decide": _assemble("decide.lua"), "live": _assemble("live.lua")}
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
