"""One script run for many (keys, args) in one round trip: the shards of a cluster decision, the tally's
flushes, the live page's reads."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import redis
from redis.exceptions import (
    AskError, ClusterDownError, MovedError, NoScriptError, ReadOnlyError, RedisClusterException, TryAgainError,
)

from .clients import is_cluster
from .scripts import MISSING, UNSUPPORTED, Entry, give_up_functions, load_library, refusal_kind, uses_functions


class NotSent(redis.ConnectionError):
    """The reply of a call that was never written (its server could not be reached or placed): it ran nothing."""


# the first pause before a call refused with TRYAGAIN is sent again (doubled at each send after it): its
# slot's keys are split between two masters for as long as a resharding takes to move the rest
TRYAGAIN_PAUSE = 0.025


def ran_nothing(reply: object) -> bool:
    """Whether a call's reply (run_each's, raise_on_error False) says it ran nothing: never written, or
    still refused when run_each gave up (its slot moving: TRYAGAIN, MOVED, ASK), refused by a replica
    (READONLY: the address leads to one until it follows a failover), or by a cluster judged down."""
    return isinstance(reply, (NotSent, TryAgainError, MovedError, AskError, ReadOnlyError, ClusterDownError))


def run_each(
    client: redis.Redis, script: Entry, calls: Sequence[tuple[Sequence[str], Sequence]], raise_on_error: bool = True
) -> list:
    """Run `script` once per (keys, args), written together (on a cluster: to every node at once); the
    replies in order.

    Each call is written once: a call whose answer is lost (a timeout, a connection Redis closed after
    reading it) may have run, so it is never sent again. A call that Redis refused ran nothing and is
    sent again: the server lacked the library or the script (a restart, a failover: it is loaded
    first, on each node that lacked it), the slot has moved (MOVED, ASK), or its keys are split by a
    move under way (TRYAGAIN: after a pause). Raises the first error of any call; with `raise_on_error`
    False, a call's error is its reply (ran_nothing tells those that ran nothing).
    """
    node_of = client.get_node_from_key if is_cluster(client) else None
    replies: list = [None] * len(calls)
    pending = list(range(len(calls)))
    asking: dict[int, object] = {}  # call -> the node an ASK named (a slot being migrated)
    pause = TRYAGAIN_PAUSE
    # at most five sends: FCALL; EVALSHA if the server turns out to have no Functions (or FCALL once
    # the library is loaded); EVALSHA once the script is loaded; one more after MOVED or ASK. TRYAGAIN
    # shares them: four pauses wait 0.375 s in all, then the call fails alone (no outage)
    for _attempt in range(5):
        functions = uses_functions(client)

        def command(i: int) -> tuple:
            keys, args = calls[i]
            name = script.function if functions else script.sha
            return ("FCALL" if functions else "EVALSHA", name, len(keys), *keys, *args)

        retry, nodes, script_missing, moved, split = [], {}, False, False, False
        for i, reply in zip(pending, _write_once(client, calls, pending, command, asking)):
            replies[i] = reply
            kind = refusal_kind(reply)
            asked = asking.pop(i, None)
            if isinstance(reply, NoScriptError):
                script_missing = True
            elif kind == MISSING:
                node = asked or (node_of(calls[i][0][0]) if node_of else None)
                nodes[node.name if node else None] = node
                if asked:
                    asking[i] = asked  # the slot is still being moved there
            elif kind == UNSUPPORTED:
                give_up_functions(client)
            elif isinstance(reply, MovedError) and node_of:
                moved = True
            elif isinstance(reply, AskError) and node_of:
                asking[i] = client.get_node(host=reply.host, port=reply.port)
                if asking[i] is None:  # a node the layout does not know yet
                    del asking[i]
                    moved = True
            elif isinstance(reply, TryAgainError):
                split = True
                if asked:
                    asking[i] = asked
            else:
                continue
            retry.append(i)
        if not retry or _attempt == 4:
            break
        if split:
            time.sleep(pause)
            pause *= 2
        try:
            if moved:
                client.nodes_manager.initialize()
            if script_missing:
                client.script_load(script.script.script)
            for node in nodes.values():
                load_library(client, script.library, **({"target_nodes": node} if node else {}))
        except (redis.RedisError, RedisClusterException) as error:  # the refused calls ran nothing
            replies = _unsent(replies, retry, error)
            break
        pending = retry
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
    return replies


def _write_once(client, calls: Sequence, indexes: list[int], command: Callable[[int], tuple], asking: dict) -> list:
    """The replies of the calls `indexes` (`command(i)` each), written once on one pooled connection per
    server: all servers are written to before any is read. A lost answer is that call's reply."""
    replies: dict[int, object] = {}
    servers: dict[str, tuple[redis.Redis, list[int]]] = {}
    if is_cluster(client):
        for i in indexes:
            try:
                node = asking.get(i) or client.get_node_from_key(calls[i][0][0])
            except RedisClusterException as error:  # e.g. a slot no node serves, mid-failover: an outage
                replies[i] = _not_sent(error)
                continue
            servers.setdefault(node.name, (client.get_redis_connection(node), []))[1].append(i)
    else:
        servers[""] = (client, list(indexes))
    written = []  # (pool, connection, calls) in the order written
    read = set()  # the connections whose every reply was read (or that were closed)
    try:
        for server, group in servers.values():
            pool = server.connection_pool
            try:
                connection = pool.get_connection()  # checked by the pool: one Redis closed is replaced
            except (redis.ConnectionError, redis.TimeoutError) as error:
                replies.update(dict.fromkeys(group, _not_sent(error)))
                continue
            written.append((pool, connection, group))
            commands = []
            for i in group:
                if i in asking:
                    commands.append(("ASKING",))
                commands.append(command(i))
            try:
                connection.send_packed_command(connection.pack_commands(commands))
            except (redis.ConnectionError, redis.TimeoutError) as error:  # part of it may have been written
                replies.update(dict.fromkeys(group, error))
                read.add(id(connection))  # closed by redis-py
        for _pool, connection, group in written:
            if id(connection) not in read:
                replies.update(_read(connection, group, asking))
                read.add(id(connection))
    finally:
        for pool, connection, _group in written:
            if id(connection) not in read:  # interrupted (a request's timeout): its replies would answer the next user
                connection.disconnect()
            pool.release(connection)
    if is_cluster(client) and any(isinstance(reply, redis.ConnectionError) for reply in replies.values()):
        refresh_slots(client)
    return [replies[i] for i in indexes]


def _read(connection: redis.Connection, group: list[int], asking: dict) -> dict[int, object]:
    """The replies of the calls `group` written on `connection`, each after ASKING's OK if it was asked."""
    answers: list[int | None] = []  # the call each reply answers (None: ASKING's OK)
    for i in group:
        if i in asking:
            answers.append(None)
        answers.append(i)
    return {i: reply for i, reply in zip(answers, read_replies(connection, len(answers))) if i is not None}


def read_replies(connection: redis.Connection, count: int) -> list:
    """The replies of `count` commands written on `connection`, an error reply as its exception. After a
    lost answer the connection is closed (its unread replies would answer its next user), and each
    unanswered command's reply is the error: a ConnectionError or TimeoutError (see `answered`)."""
    replies: list = []
    try:
        while len(replies) < count:
            replies.append(_reply(connection))
    except (redis.ConnectionError, redis.TimeoutError, OSError) as error:
        connection.disconnect()
        if isinstance(error.__context__, ReadOnlyError):
            # Sentinel's connection raises READONLY so (the master it knew was demoted): that server, a
            # replica now, refused what was written to it
            lost: Exception = error.__context__
        else:
            lost = error if isinstance(error, redis.RedisError) else redis.ConnectionError(str(error))
        replies += [lost] * (count - len(replies))
    return replies


def answered(reply: object) -> bool:
    """Whether Redis answered (an error reply included): not a lost answer of read_replies."""
    return not isinstance(reply, (redis.ConnectionError, redis.TimeoutError))


def _reply(connection: redis.Connection) -> object:
    try:
        return connection.read_response()
    except redis.ResponseError as error:
        return error


def _not_sent(error: BaseException) -> NotSent:
    unsent = NotSent(str(error))
    unsent.__cause__ = error
    return unsent


def _unsent(replies: list, indexes: list[int], error: BaseException) -> list:
    unsent, refused = _not_sent(error), set(indexes)
    return [unsent if i in refused else reply for i, reply in enumerate(replies)]


def refresh_slots(client) -> None:
    """After a node failed: ask the cluster who serves which slot (a replica may have been promoted)."""
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException):
        pass  # the cluster cannot say yet: the next request asks again
