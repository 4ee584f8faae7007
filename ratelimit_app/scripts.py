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
from typing import Any, Sequence

import redis
import redis.asyncio
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoPermissionError, NoScriptError, RedisClusterException, ResponseError

from .conf import get_setting
from .strategies import STRATEGIES
from .connection import is_cluster
from .decision_connection import execute

LIBRARY_FILES = ("clock.lua", "series.lua", "activity.lua", "contract.lua")
STRATEGY_FILES = tuple(strategy.lua for strategy in STRATEGIES.values())
ENTRY_POINTS = ("decide", "live", "totals", "trend", "tally")  # release.lua stands alone (engine.py)
_NAME = "@NAME@"  # stands for the library's name until the source is hashed


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text(encoding="utf-8")


def _shared() -> list[str]:
    # each strategy's largest cost is the Python half's figure, so the two halves cannot disagree
    most = [f"strategies.{s.name}.most = {s.most}" for s in STRATEGIES.values() if s.most]
    return ["local strategies = {}"] + [_lua(name) for name in LIBRARY_FILES + STRATEGY_FILES] + most


def _assemble(entry: str) -> str:
    """One entry point as a script of its own, for EVAL/EVALSHA."""
    return "\n".join(_shared() + [_lua(f"{entry}.lua")])


def _library() -> tuple[str, str]:
    """(name, source) of the Functions library: one function per entry point, its file's body wrapped
    as `function(KEYS, ARGV) ... end`. The name carries a hash of the source, so two versions of the
    app sharing one Redis load two libraries and never call each other's functions."""
    registrations = [
        f"redis.register_function('{_NAME}_{entry}', function(KEYS, ARGV)\n{_lua(f'{entry}.lua')}\nend)"
        for entry in ENTRY_POINTS
    ]
    source = "\n".join([f"#!lua name={_NAME}"] + _shared() + registrations)
    name = "ratelimit_" + hashlib.sha1(source.encode()).hexdigest()[:12]
    return name, source.replace(_NAME, name)


# --- which command a client uses --------------------------------------------------------------------

_MISSING, _UNSUPPORTED = "missing", "unsupported"
# Servers that answered that they have no Functions (an older Redis, or an ACL that forbids them),
# by the connection pool that reaches them (every client of one pool: the shared one, the threads'
# decision clients), or by the client where it has no single pool (a cluster): EVALSHA from then
# on, without asking again.
_without_functions: weakref.WeakSet = weakref.WeakSet()


def _server_of(client: Any) -> Any:
    return getattr(client, "connection_pool", client)


def _uses_functions(client: Any) -> bool:
    if get_setting("RATELIMIT_REDIS_FUNCTIONS") is False:
        return False
    # asked on every decision: an empty set (the common case) is answered without making a weak reference
    return not _without_functions or _server_of(client) not in _without_functions


def _kind(error: BaseException) -> str | None:
    """Whether a reply says the function is not loaded, or that this server cannot run Functions."""
    if not isinstance(error, ResponseError):
        return None
    text = str(error).lower()
    if "function not found" in text:
        return _MISSING
    if "unknown command" in text:
        return _UNSUPPORTED
    if isinstance(error, NoPermissionError) and ("'fcall'" in text or "'function" in text):
        return _UNSUPPORTED  # an ACL that allows EVALSHA only
    return None


def _give_up_functions(client: Any) -> None:
    _without_functions.add(_server_of(client))


def _loaded(error: ResponseError, client: Any) -> bool:
    """After FUNCTION LOAD failed: True if the library is there anyway (another worker loaded it)."""
    if "already exists" in str(error):
        return True
    if _kind(error) == _UNSUPPORTED:
        _give_up_functions(client)
        return False
    raise error


def _load(client: redis.Redis, library: str, **options: Any) -> bool:
    """FUNCTION LOAD (on a cluster: on the node in `options`); False if the server has no Functions."""
    try:
        client.execute_command("FUNCTION LOAD", library, **options)
    except ResponseError as error:
        return _loaded(error, client)
    heartbeat(client)  # before a prune running now could take the library for one nobody uses
    return True


async def _aload(client: redis.asyncio.Redis, library: str) -> bool:
    try:
        await client.execute_command("FUNCTION LOAD", library)
    except ResponseError as error:
        return _loaded(error, client)
    await client.set(library_key(scripts.library_name), "1", px=HEARTBEAT_MS)
    return True


def _to_load(error: ResponseError, client: Any) -> bool:
    """After FCALL failed: True if the server lacks the library (load it, send again), False if it has
    no Functions (EVALSHA from now on); any other error is raised."""
    kind = _kind(error)
    if kind is None:
        raise error
    if kind == _UNSUPPORTED:
        _give_up_functions(client)
        return False
    return True


class Entry:
    """One entry point, called as a redis-py Script is: `entry(keys, args, client)`.

    FCALL where the server has Functions; a server that lacks the library (restarted, FUNCTION
    FLUSH, a replica promoted without it) is given it and asked again: the refused call ran
    nothing, so nothing counts twice. Elsewhere EVALSHA, through redis-py's Script.
    """

    def __init__(self, function: str, library: str, script: Script) -> None:
        self.function = function
        self.library = library
        self.script = script  # the EVALSHA path

    @property
    def sha(self) -> str:
        return self.script.sha

    def __call__(self, keys: Sequence = (), args: Sequence = (), client: Any = None) -> Any:
        if _uses_functions(client):
            # a cluster client would otherwise ask a node COMMAND GETKEYS to find FCALL's keys
            options = {"target_nodes": client.get_node_from_key(keys[0])} if keys and is_cluster(client) else {}
            command = ("FCALL", self.function, len(keys), *keys, *args)
            try:
                return execute(client, *command, **options)
            except ResponseError as error:
                if _to_load(error, client) and _load(client, self.library, **options):
                    return execute(client, *command, **options)
        return self.script(keys, args, client)


class AsyncEntry:
    """Entry for redis-py's asyncio client (pass the client of the running loop at call time)."""

    def __init__(self, function: str, library: str, script: AsyncScript) -> None:
        self.function = function
        self.library = library
        self.script = script

    @property
    def sha(self) -> str:
        return self.script.sha

    async def __call__(self, keys: Sequence = (), args: Sequence = (), client: Any = None) -> Any:
        if _uses_functions(client):
            command = ("FCALL", self.function, len(keys), *keys, *args)
            try:
                return await client.execute_command(*command)
            except ResponseError as error:
                if _to_load(error, client) and await _aload(client, self.library):
                    return await client.execute_command(*command)
        return await self.script(keys, args, client)


class _Scripts:
    """The entry points, created once with the first client (a Script only needs one for its SHA)."""

    def __init__(self) -> None:
        self._sources = {name: _assemble(name) for name in ENTRY_POINTS}
        self.library_name, self.library = _library()
        self._entries: dict[str, Entry] = {}
        self._async_entries: dict[str, AsyncEntry] = {}

    def function(self, name: str) -> str:
        return f"{self.library_name}_{name}"

    def get(self, name: str, client: redis.Redis) -> Entry:
        entry = self._entries.get(name)
        if entry is None:
            script = client.register_script(self._sources[name])
            entry = self._entries[name] = Entry(self.function(name), self.library, script)
        return entry

    def get_async(self, name: str, client: redis.asyncio.Redis) -> AsyncEntry:
        entry = self._async_entries.get(name)
        if entry is None:
            script = client.register_script(self._sources[name])
            entry = self._async_entries[name] = AsyncEntry(self.function(name), self.library, script)
        return entry


scripts = _Scripts()


def now_arg(now: float | None) -> str:
    """A caller's `now` (seconds) as the scripts take it: integer milliseconds, or '' for Redis TIME."""
    return "" if now is None else str(int(now * 1000))


def run_each(client: redis.Redis, script: Entry, calls: Sequence[tuple[Sequence[str], Sequence]]) -> list:
    """Run `script` once per (keys, args) in one pipeline (on a cluster: every node at once); the replies in order.

    A server that restarted or took over from a failed master may lack the library or the script:
    it is loaded (on a cluster: on each node that lacked it) and only the calls that were refused
    are sent again (such a call ran nothing, so nothing counts twice). Raises the first Redis error
    of any call.
    """
    # On a cluster, name each call's node (from the client's own slot map): otherwise the pipeline asks
    # a server COMMAND GETKEYS for every script call, one more round trip each.
    node_of = client.get_node_from_key if is_cluster(client) else None

    def send(indexes: list[int], functions: bool) -> list:
        with client.pipeline(transaction=False) as pipe:
            for i in indexes:
                keys, args = calls[i]
                # execute_command: a cluster pipeline refuses its evalsha() method, not the command itself
                options = {"target_nodes": node_of(keys[0])} if node_of else {}
                if functions:
                    pipe.execute_command("FCALL", script.function, len(keys), *keys, *args, **options)
                else:
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **options)
            return pipe.execute(raise_on_error=False)

    replies: list = [None] * len(calls)
    pending = list(range(len(calls)))
    try:
        # at most three sends: FCALL; EVALSHA if the server turns out to have no Functions (or FCALL
        # once the library is loaded); EVALSHA once the script is loaded
        for _attempt in range(3):
            retry, nodes, script_missing = [], {}, False
            for i, reply in zip(pending, send(pending, _uses_functions(client))):
                replies[i] = reply
                kind = _kind(reply)
                if isinstance(reply, NoScriptError):
                    script_missing = True
                elif kind == _MISSING:
                    node = node_of(calls[i][0][0]) if node_of else None
                    nodes[node.name if node else None] = node
                elif kind == _UNSUPPORTED:
                    _give_up_functions(client)
                else:
                    continue
                retry.append(i)
            if not retry:
                break
            if script_missing:
                client.script_load(script.script.script)
            for node in nodes.values():
                _load(client, script.library, **({"target_nodes": node} if node else {}))
            pending = retry
    except RedisClusterException as error:  # e.g. a slot no node serves, mid-failover: an outage, not a bug
        raise redis.ConnectionError(f"Redis Cluster: {error}") from error
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


# --- old libraries ----------------------------------------------------------------------------------

LIBRARY_PREFIX = "ratelimit_"
HEARTBEAT_MS = 60_000  # how long a library counts as in use after a worker last said it runs it
HEARTBEAT_EVERY = 10.0  # seconds between a worker's refreshes (its tally's flushes send them)


def library_key(name: str) -> str:
    """The key saying that some worker runs library `name`. Without the site's key prefix: a library
    serves every site of the same version on the server, so every site's workers keep it."""
    return f"ratelimit-library:{name}"


def heartbeat(client: Any) -> None:
    """Say that this worker runs its library, for HEARTBEAT_MS (a worker that runs none says nothing)."""
    if _uses_functions(client):
        client.set(library_key(scripts.library_name), "1", px=HEARTBEAT_MS)


def _primaries(client: Any) -> list:
    """A client per server that holds libraries: every master of a cluster, else the one server."""
    if is_cluster(client):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def _library_names(server: redis.Redis) -> list[str]:
    """The names of the libraries of ours on one server (FUNCTION LIST, RESP2 or RESP3)."""
    names = []
    for library in server.execute_command("FUNCTION LIST", "LIBRARYNAME", LIBRARY_PREFIX + "*"):
        fields = library if isinstance(library, dict) else dict(zip(library[::2], library[1::2]))
        name = fields.get(b"library_name", fields.get("library_name"))
        name = name.decode() if isinstance(name, bytes) else name
        if name.startswith(LIBRARY_PREFIX):
            names.append(name)
    return names


def prune(client: Any) -> tuple[list[str], list[str]]:
    """Delete the libraries of ours that no worker has said it runs within HEARTBEAT_MS, never this
    version's: -> (deleted, kept). A worker whose library goes anyway (it had not said so yet) loads it
    again at its next call, which the refusal left unrun. ([], []) where the server has no Functions."""
    own = scripts.library_name
    deleted, kept = [], []
    for server in _primaries(client):
        try:
            names = _library_names(server)
        except ResponseError as error:
            if _kind(error) == _UNSUPPORTED:
                return [], []
            raise
        for name in names:
            if name == own or client.exists(library_key(name)):
                kept.append(name)
                continue
            try:
                server.execute_command("FUNCTION DELETE", name)
            except ResponseError as error:
                if "not found" not in str(error).lower():  # deleted meanwhile by another prune
                    raise
            deleted.append(name)
    return sorted(set(deleted)), sorted(set(kept))
