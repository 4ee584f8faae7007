"""Old Functions libraries: those of earlier versions of the app that no worker runs any more, found and
deleted (`manage.py ratelimit prune`)."""

from __future__ import annotations

from typing import Any

import redis
from redis.exceptions import NoPermissionError, ResponseError

from .clients import is_cluster
from .scripts import LIBRARY_WORDS, UNSUPPORTED, library_of_word, refusal_kind, scripts

LIBRARY_PREFIX = "ratelimit_"


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


def _in_use(client: Any) -> set[str]:
    """The libraries some worker of any site on the server said it runs within HEARTBEAT_MS (a SCAN of
    the keyspace: every site's words, whatever its key prefix)."""
    return {library_of_word(key if isinstance(key, bytes) else key.encode())
            for key in client.scan_iter(match=LIBRARY_WORDS, count=1000)}


def prune(client: Any) -> tuple[list[str], list[str]]:
    """Delete the libraries of ours that no worker has said it runs within HEARTBEAT_MS, never this
    version's: -> (deleted, kept). A worker whose library goes anyway (it had not said so yet) loads it
    again at its next call, which the refusal left unrun. ([], []) where the server has no Functions."""
    own = scripts.library_name
    deleted, kept = [], []
    in_use: set[str] | None = None  # read once there is another version's library to judge
    for server in _primaries(client):
        try:
            names = _library_names(server)
        except ResponseError as error:
            # a user that may not list them is no server without Functions (as a decision takes it)
            if refusal_kind(error) == UNSUPPORTED and not isinstance(error, NoPermissionError):
                return [], []
            raise
        others = [name for name in names if name != own]
        kept += [name for name in names if name == own]
        if others and in_use is None:
            in_use = _in_use(client)
        for name in others:
            if name in in_use:
                kept.append(name)
                continue
            try:
                server.execute_command("FUNCTION DELETE", name)
            except ResponseError as error:
                if "not found" not in str(error).lower():  # deleted meanwhile by another prune
                    raise
            deleted.append(name)
    return sorted(set(deleted)), sorted(set(kept))
