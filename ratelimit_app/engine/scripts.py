"""The Lua scripts, read from lua/*.lua and assembled once: the shared pieces (clock.lua, series.lua,
activity.lua, contract.lua), one file per strategy, then an entry point (decide.lua, live.lua, totals.lua ...).

Where the server has Redis Functions (Redis >= 7, Valkey) the pieces form one library, loaded with
FUNCTION LOAD and called with FCALL: the shared tables and the strategies are then built once per
load rather than at every call. Elsewhere (or with RATELIMIT_REDIS_FUNCTIONS = False) each entry
point is one script run with EVALSHA through redis-py's Script, which reloads it after NOSCRIPT.
"""

from __future__ import annotations

import hashlib
import weakref
from importlib import resources
from functools import partial
from typing import Any, Sequence

import redis
import redis.asyncio
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoPermissionError, ResponseError

from ..conf import get_setting
from ..drivers import Io, Steps, arun, run
from ..strategies import STRATEGIES
from . import keys
from .clients import client as shared_client
from .clients import is_cluster
from .decision_connection import execute

LIBRARY_FILES = ("clock.lua", "series.lua", "activity.lua", "contract.lua", "decision.lua")
STRATEGY_FILES = tuple(strategy.lua for strategy in STRATEGIES.values())
ENTRY_POINTS = ("decide", "decide_with", "live", "totals", "trend", "tally")  # release.lua stands alone (giveback.py)
# what a policy's terms name its strategy by (decide.lua): 16 * its place, the bits above enforce and seen
STRATEGY_CODES = {name: 16 * place for place, name in enumerate(STRATEGIES)}
assert len(STRATEGY_CODES) <= 16, "the terms' first field has 4 bits for the strategy"
_NAME = "@NAME@"  # stands for the library's name until the source is hashed


def _lua(name: str) -> str:
    return resources.files("ratelimit_app").joinpath("lua", name).read_text(encoding="utf-8")


def _shared() -> list[str]:
    # each strategy's largest cost and its code are the Python half's figures, so the halves cannot disagree
    most = [f"strategies.{s.name}.most = {s.most}" for s in STRATEGIES.values() if s.most]
    codes = [f"by_code[{code}] = strategies.{name}" for name, code in STRATEGY_CODES.items()]
    files = [_lua(name) for name in LIBRARY_FILES + STRATEGY_FILES]
    return ["local strategies, by_code = {}, {}"] + files + most + codes


def _assemble(entry: str) -> str:
    """One entry point as a script of its own, for EVAL/EVALSHA."""
    return "\n".join(_shared() + [_lua(f"{entry}.lua")])


LIBRARY_HASH = 12  # hex digits of the source's hash in a library's name


def _library() -> tuple[str, str]:
    """(name, source) of the Functions library: one function per entry point, its file's body wrapped
    as `function(KEYS, ARGV) ... end`. The name carries a hash of the source, so two versions of the
    app sharing one Redis load two libraries and never call each other's functions."""
    registrations = [
        f"redis.register_function('{_NAME}_{entry}', function(KEYS, ARGV)\n{_lua(f'{entry}.lua')}\nend)"
        for entry in ENTRY_POINTS
    ]
    source = "\n".join([f"#!lua name={_NAME}"] + _shared() + registrations)
    name = "ratelimit_" + hashlib.sha1(source.encode()).hexdigest()[:LIBRARY_HASH]
    return name, source.replace(_NAME, name)


# --- which command a client uses --------------------------------------------------------------------

MISSING, UNSUPPORTED = "missing", "unsupported"
# Servers that answered that they have no Functions (an older Redis, or an ACL that forbids them),
# by the connection pool that reaches them (every client of one pool: the shared one, the threads'
# decision clients), or by the client where it has no single pool (a cluster): EVALSHA from then
# on, without asking again.
_without_functions: weakref.WeakSet = weakref.WeakSet()


def _server_of(client: Any) -> Any:
    return getattr(client, "connection_pool", client)


def uses_functions(client: Any) -> bool:
    if get_setting("RATELIMIT_REDIS_FUNCTIONS") is False:
        return False
    # asked on every decision: an empty set (the common case) is answered without making a weak reference
    return not _without_functions or _server_of(client) not in _without_functions


def refusal_kind(error: BaseException) -> str | None:
    """Whether a reply says the function is not loaded, or that this server cannot run Functions."""
    if not isinstance(error, ResponseError):
        return None
    text = str(error).lower()
    if "function not found" in text:
        return MISSING
    if "unknown command" in text:
        return UNSUPPORTED
    if isinstance(error, NoPermissionError) and ("'fcall'" in text or "'function" in text):
        return UNSUPPORTED  # an ACL that allows EVALSHA only
    return None


def give_up_functions(client: Any) -> None:
    _without_functions.add(_server_of(client))


def _loaded(error: ResponseError, client: Any) -> bool:
    """After FUNCTION LOAD failed: True if the library is there anyway (another worker loaded it)."""
    if "already exists" in str(error):
        return True
    if refusal_kind(error) == UNSUPPORTED:
        give_up_functions(client)
        return False
    raise error


# The commands of one call are steps (drivers.py): written once for both clients, sent by run() or arun()
EVALSHA = object()  # what steps return when the server has no Functions


def _command(client: Any, command: tuple, options: dict) -> Io:
    return Io(partial(execute, client), client.execute_command, command, options)


def _loading(client: Any, library: str, options: dict) -> Steps:
    """FUNCTION LOAD (on a cluster: on the node in `options`), as steps; False if the server has no Functions."""
    try:
        yield _command(client, ("FUNCTION LOAD", library), options)
    except ResponseError as error:
        return _loaded(error, client)
    # before a prune running now could take the library for one nobody uses
    yield _command(client, ("SET", library_key(scripts.library_name), "1", "PX", HEARTBEAT_MS), {})
    return True


def load_library(client: redis.Redis, library: str, **options: Any) -> bool:
    """FUNCTION LOAD (on a cluster: on the node in `options`); False if the server has no Functions."""
    return run(_loading(client, library, options))


def _to_load(error: ResponseError, client: Any) -> bool:
    """After FCALL failed: True if the server lacks the library (load it, send again), False if it has
    no Functions (EVALSHA from now on); any other error is raised."""
    kind = refusal_kind(error)
    if kind is None:
        raise error
    if kind == UNSUPPORTED:
        give_up_functions(client)
        return False
    return True


class Entry:
    """One entry point, called as a redis-py Script is: `entry(keys, args, client)`.

    FCALL where the server has Functions; a server that lacks the library (restarted, FUNCTION
    FLUSH, a replica promoted without it) is given it and asked again: the refused call ran
    nothing, so nothing counts twice. Elsewhere EVALSHA, through redis-py's Script.
    """

    def __init__(self, function: str, library: str, script: Script | AsyncScript) -> None:
        self.function = function
        self.library = library
        self.script = script  # the EVALSHA path

    @property
    def sha(self) -> str:
        return self.script.sha

    def _fcall(self, keys: Sequence, args: Sequence, client: Any) -> tuple[tuple, dict]:
        """The FCALL command and its options."""
        # a cluster client would otherwise ask a node COMMAND GETKEYS to find FCALL's keys
        options = {"target_nodes": client.get_node_from_key(keys[0])} if keys and is_cluster(client) else {}
        return ("FCALL", self.function, len(keys), *keys, *args), options

    def _refused(self, error: ResponseError, client: Any, command: tuple, options: dict) -> Steps:
        """After the FCALL was refused: load the library and send it again, as steps; EVALSHA when the
        server has no Functions (any other error is raised)."""
        if not _to_load(error, client) or not (yield from _loading(client, self.library, options)):
            return EVALSHA
        return (yield _command(client, command, options))

    def __call__(self, keys: Sequence = (), args: Sequence = (), client: Any = None) -> Any:
        if uses_functions(client):
            command, options = self._fcall(keys, args, client)
            try:  # the first call is a plain one, not steps: it is every decision's
                return execute(client, *command, **options)
            except ResponseError as error:
                reply = run(self._refused(error, client, command, options))
            if reply is not EVALSHA:
                return reply
        return self.script(keys, args, client)


class AsyncEntry(Entry):
    """Entry for redis-py's asyncio client (pass the client of the running loop at call time)."""

    async def __call__(self, keys: Sequence = (), args: Sequence = (), client: Any = None) -> Any:
        if uses_functions(client):  # Entry.__call__'s twin: its first call awaited
            command, options = self._fcall(keys, args, client)
            try:
                return await client.execute_command(*command, **options)
            except ResponseError as error:
                reply = await arun(self._refused(error, client, command, options))
            if reply is not EVALSHA:
                return reply
        return await self.script(keys, args, client)


class _Scripts:
    """The entry points, created once with the first client of each class (a Script only needs one for its SHA)."""

    def __init__(self) -> None:
        self._sources = {name: _assemble(name) for name in ENTRY_POINTS}
        self.library_name, self.library = _library()
        self._entries: dict[tuple[str, type], Entry] = {}

    def function(self, name: str) -> str:
        return f"{self.library_name}_{name}"

    def get(self, name: str, client: Any) -> Entry:
        """The entry point `name` for this client: an AsyncEntry (awaited) for an asyncio client."""
        entry = self._entries.get((name, type(client)))
        if entry is None:
            kind = AsyncEntry if isinstance(client, redis.asyncio.Redis) else Entry
            # a Script keeps the client it was made with: not a thread's own, whose connection would never
            # go back to the pool once its thread ended (every call passes its client)
            script = (client if kind is AsyncEntry else shared_client()).register_script(self._sources[name])
            entry = self._entries[(name, type(client))] = kind(self.function(name), self.library, script)
        return entry


scripts = _Scripts()


def now_arg(now: float | None) -> str:
    """A caller's `now` (seconds) as the scripts take it: integer milliseconds, or '' for Redis TIME."""
    return "" if now is None else str(int(now * 1000))


# --- which libraries are in use ---------------------------------------------------------------------

HEARTBEAT_MS = 60_000  # how long a library counts as in use after a worker last said it runs it
HEARTBEAT_EVERY = 10.0  # seconds between a worker's refreshes (its tally's flushes send them)


# every site's words, ending with a library's name (an earlier version wrote ratelimit-library:<name>)
LIBRARY_WORDS = "*library:ratelimit_" + "[0-9a-f]" * LIBRARY_HASH


def library_key(name: str) -> str:
    """The key saying that some worker of this site runs library `name`, under the site's key prefix
    like every key it writes (a Redis user may be confined to it); a prune reads every site's."""
    return f"{keys.prefix()}:library:{name}"


def library_of_word(key: bytes) -> str:
    """The library a word found by LIBRARY_WORDS names (its end: a prefix may hold any bytes)."""
    return key[-len("ratelimit_") - LIBRARY_HASH:].decode("ascii")


def heartbeat(client: Any) -> None:
    """Say that this worker runs its library, for HEARTBEAT_MS (a worker that runs none says nothing)."""
    if uses_functions(client):
        client.set(library_key(scripts.library_name), "1", px=HEARTBEAT_MS)
