"""One script run for many (keys, args) in one pipeline: the shards of a cluster decision, the tally's
flushes, the live page's reads."""

from __future__ import annotations

from typing import Sequence

import redis
from redis.exceptions import NoScriptError, RedisClusterException

from .clients import is_cluster
from .scripts import MISSING, UNSUPPORTED, Entry, give_up_functions, load_library, refusal_kind, uses_functions


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
            for i, reply in zip(pending, send(pending, uses_functions(client))):
                replies[i] = reply
                kind = refusal_kind(reply)
                if isinstance(reply, NoScriptError):
                    script_missing = True
                elif kind == MISSING:
                    node = node_of(calls[i][0][0]) if node_of else None
                    nodes[node.name if node else None] = node
                elif kind == UNSUPPORTED:
                    give_up_functions(client)
                else:
                    continue
                retry.append(i)
            if not retry:
                break
            if script_missing:
                client.script_load(script.script.script)
            for node in nodes.values():
                load_library(client, script.library, **({"target_nodes": node} if node else {}))
            pending = retry
    except RedisClusterException as error:  # e.g. a slot no node serves, mid-failover: an outage, not a bug
        raise redis.ConnectionError(f"Redis Cluster: {error}") from error
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
