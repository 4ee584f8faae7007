"""Giving back the places of requests in flight (concurrency policies) when they end: one EVAL of
lua/release.lua per slot, written without waiting for its reply (read later), owed while Redis cannot
take it, and sent again when its connection closed before Redis answered or a moving slot refused it."""

from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing.util
import os
import threading
from importlib import resources
from typing import Sequence

import redis
from asgiref.sync import sync_to_async
from redis.exceptions import AskError, MovedError

from ..loggate import LogGate
from ..values import Adjustment, Held
from . import decision_connection, keys
from .aclients import aclient
from .batches import answered, ran_nothing, read_replies, refresh_slots
from .circuit import RedisUnavailable, breaker, describe
from .clients import client, cluster_configured, is_cluster, socket_of
from .decision_connection import ALL_READ, OUTBOX, UNREAD, decision_client, read_unread, replace_if_closed
from .settling import settle_commands

logger = logging.getLogger("ratelimit_app")

# The script's code without its comments: EVAL hashes what it is sent, at every give-back.
_SOURCE = resources.files("ratelimit_app").joinpath("lua", "release.lua").read_text(encoding="utf-8")
RELEASE = "\n".join(line for line in _SOURCE.splitlines() if line.strip() and not line.lstrip().startswith("--"))


def release(held: Sequence[Held | Adjustment]) -> None:
    """Give back the places requests held (they ended), and move their metered policies by what they used
    beyond or short of their estimates (Adjustment, settling.py): one EVAL of each per slot (on one server:
    in one write), written without waiting for a reply. While Redis cannot take them (down, the circuit
    open) they are owed (Owed), never waited for."""
    held = _sendable(held)
    if not held:
        return
    try:
        breaker.call(lambda: send(decision_client(), held))
    except RedisUnavailable as error:
        owed.add(held, error)


def _sendable(held: Sequence[Held]) -> tuple:
    """`held` with what is owed, to send now; () while the circuit is open or about to probe (then it is
    owed: the decisions probe, a give-back never waits)."""
    held = owed.adding(held)
    if held and breaker.open_until:
        owed.add(held)
        return ()
    return held


async def arelease(held: Sequence[Held | Adjustment]) -> None:
    """release() for async code: only the write is awaited; its reply is read by a task of its own
    (the sync twin leaves it for its connection's next use), which then keeps the connection."""
    if cluster_configured():
        return await sync_to_async(release, thread_sensitive=False)(held)
    held = _sendable(held)
    if not held:
        return
    redis_client = aclient()
    commands = [command for _, command, _ in _release_commands(held, None)]
    written = False

    async def send():
        nonlocal written
        connection = await redis_client.take()
        try:
            await connection.send_packed_command(connection.pack_commands(commands))
        except BaseException:
            await redis_client.to_pool(connection)
            raise
        written = True
        task = asyncio.ensure_future(_aread_replies(redis_client, connection, len(commands), held))
        _reading.add(task)  # the loop keeps tasks weakly
        task.add_done_callback(_reading.discard)

    try:
        await breaker.acall(send)
    except RedisUnavailable as error:
        owed.add(held, error)
    except BaseException:  # cancelled (the request's client left) before the write: owed, never lost
        if not written:
            owed.add(held)
        raise


_reading: set[asyncio.Future] = set()


async def _aread_replies(redis_client, connection, count: int, held: Sequence[Held]) -> None:
    """Read the give-back's replies, then keep the connection for the client's next command. Until Redis
    answered, it may not have run (a connection closed with it unread, CLIENT KILL): then it is owed,
    and sent again."""
    answered = False
    try:
        for _ in range(count):
            try:
                await connection.read_response()
            except redis.ResponseError:
                pass  # nothing to do about a give-back that failed: its lease runs out
        answered = True
    except (redis.RedisError, OSError):
        pass
    finally:  # also when the loop ends first (its tasks are cancelled): sent again from a thread
        if answered:
            await redis_client.keep(connection)
        else:
            owed.lost(held)
            await redis_client.discard(connection)


unsure_said = LogGate()  # settled usage not sent again: said once a minute


class Owed:
    """Places whose give-back Redis could not take, and settled usage it did not run: sent with the next
    give-back, or by a timer within a second (which may probe an open circuit). Bounded: past LIMIT the
    oldest are dropped (logged), and their leases run out instead (settled usage: the estimates stand)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.places: list[Held] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._cause = ""  # why the last places were owed, as logged if places are dropped

    def adding(self, held: Sequence[Held]) -> list[Held]:
        """`held` with what is owed (no longer owed: the caller sends it, or owes it again)."""
        if not self.places:
            return list(held)
        with self._lock:
            owed, self.places = self.places, []
        return owed + list(held)

    def add(self, held: Sequence[Held], cause: BaseException | None = None) -> None:
        """Owe `held`; `cause`: why Redis did not take them (else the circuit's last outage)."""
        with self._lock:
            self.places += held
            if cause is not None:
                self._cause = describe(cause)
            if len(self.places) > self.LIMIT:
                dropped, self.places = self.places[: -self.LIMIT], self.places[-self.LIMIT:]
                places = sum(1 for item in dropped if type(item) is Held)
                cause = self._cause or breaker.cause
                if places:
                    logger.warning("ratelimit: %d places in flight not given back (their leases run out instead): %s",
                                   places, cause)
                if places < len(dropped):
                    logger.warning("ratelimit: %d settled usages not sent (their requests' estimates stand): %s",
                                   len(dropped) - places, cause)
            if self._timer is None:
                self._timer = threading.Timer(1.0, self._retry)
                self._timer.daemon = True
                self._timer.start()

    def _retry(self) -> None:
        with self._lock:
            self._timer = None
            held, self.places = self.places, []
        if held:
            try:
                # on a pooled connection, answered before it goes back: a timer's thread ends at once,
                # and a connection kept for it would go back to the pool with replies unread
                breaker.call(lambda: send(client(), held))
            except RedisUnavailable as error:
                self.add(held, error)

    def lost(self, sent: Sequence[Held | Adjustment], cause: BaseException | None = None) -> None:
        """What was written but never answered (the connection lost its replies): it may have run. Places
        are owed again (given back twice, harmlessly); settled usage is not, so that it never counts twice."""
        places = [item for item in sent if type(item) is Held]
        unsure = len(sent) - len(places)
        if unsure and unsure_said.due():  # (an async request's loop may end before its reply is read)
            logger.warning("ratelimit: %d settled usages may not have reached Redis (their reply was never read: "
                           "the connection closed, or the loop that waited ended); not sent again, so that none "
                           "counts twice", unsure)
        if places:
            self.add(places, cause)

    def forget(self) -> None:
        with self._lock:
            self.places = []

    def _forked(self) -> None:
        # what the parent owes is the parent's to send (sent by the child too, settled usage counts twice);
        # its lock may have been held by a thread the child does not have, its timer runs in the parent only
        self._lock, self._timer, self.places = threading.Lock(), None, []


owed = Owed()
os.register_at_fork(after_in_child=owed._forked)


def send(redis_client, held: Sequence[Held], strict: bool = False) -> None:
    """Give back `held`; what Redis did not take is owed, or with `strict` (on a cluster) raised."""
    if is_cluster(redis_client):
        for key, command, group in _release_commands(held, redis_client.keyslot):
            _send_to_slot(redis_client, key, command, group, strict)
        return
    kept = getattr(redis_client, "connection", None)
    commands = _release_commands(held, None)
    if kept is None:
        _owe_unless_taken(_send_answered(redis_client, [command for _, command, _ in commands]), held)
    else:
        _send_unanswered(kept, [command for _, command, _ in commands], held)


def _send_to_slot(cluster, key: str, command: tuple, held: Sequence[Held], strict: bool = False) -> None:
    """One slot's give-back, on the master the layout names; sent on to the node an ASK names (the slot
    is being moved there: with ASKING), or after MOVED where the layout read again says. Refused
    otherwise (TRYAGAIN: the slot's keys are split by the move), it ran nothing: owed."""
    node, asking = cluster.get_node_from_key(key), False
    for _ in range(3):
        reply = _send_answered(cluster.get_redis_connection(node), [("ASKING",), command] if asking else [command])[-1]
        if isinstance(reply, AskError):
            node, asking = cluster.get_node(host=reply.host, port=reply.port), True
        elif isinstance(reply, MovedError):
            refresh_slots(cluster)
            node, asking = cluster.get_node_from_key(key), False
        else:
            break
        if node is None:  # a node the layout does not know yet
            break
    _owe_unless_taken([reply], held, strict)


def _owe_unless_taken(replies: Sequence, held: Sequence[Held], strict: bool = False) -> None:
    """Owe the places (`strict`: raise instead) when a reply was lost or says the give-back ran nothing;
    one that failed otherwise (an error reply) is not sent again: its lease runs out."""
    refused = [reply for reply in replies if not answered(reply) or ran_nothing(reply)]
    if refused and strict:
        raise refused[0]
    if any(ran_nothing(reply) for reply in refused):
        owed.add(held, refused[0])
    elif refused:
        owed.lost(held, refused[0])


def _release_commands(sent: Sequence[Held | Adjustment], slot_of) -> list[tuple[str, tuple, list]]:
    """(a key, the EVAL, its places or settled usage) for each slot the counters live in (`slot_of` None:
    one server, one EVAL of release.lua, and one of settle.lua when usage is settled)."""
    held = [item for item in sent if type(item) is Held]
    if len(held) < len(sent):
        adjustments = [item for item in sent if type(item) is not Held]
        return _release_commands(held, slot_of) + settle_commands(adjustments, slot_of)
    key_prefix = keys.prefix()
    groups: dict[int, tuple[list[str], list, list[Held]]] = {}
    for place in held:
        counter = keys.counter_key(place.policy, place.subject.key, key_prefix)
        counters, args, places = groups.setdefault(slot_of(counter) if slot_of else 0, ([], [], []))
        counters.append(counter)
        args += (place.lease, place.cost, place.policy.window_ms)
        places.append(place)
    return [(counters[0], ("EVAL", RELEASE, len(counters), *counters, *args), places)
            for counters, args, places in groups.values()]


def _send_answered(redis_client: redis.Redis, commands: Sequence[tuple]) -> list:
    """On a pooled connection: write `commands` and read their replies (batches.read_replies) before
    lending it again (a reply left on it would answer its next user)."""
    pool = redis_client.connection_pool
    connection = pool.get_connection()  # checked by the pool before it lends it
    try:
        connection.send_packed_command(connection.pack_commands(commands))
        return read_replies(connection, len(commands))
    finally:
        pool.release(connection)


def _send_unanswered(kept: redis.Connection, commands: Sequence[tuple], held: Sequence[Held | Adjustment]) -> None:
    """On the thread's kept connection: write `commands` and wait for no reply. The replies are read
    when they have come, at the latest by the connection's next command, before its own reply.

    Settled usage alone (no place to give back) waits for the connection's next write instead, a decision
    call's or a give-back's (decision_connection.OUTBOX): it makes no round trip of its own. A timer sends
    what no write took within a second (Carried)."""
    if all(type(item) is not Held for item in held):
        carried.add(kept, kept.pack_commands(commands), len(commands), held)
        return
    read_unread(kept)
    _, due, owing = getattr(kept, UNREAD, ALL_READ)
    if not due:  # nothing is due on it: readable is Redis having closed it (idle timeout, CLIENT KILL)
        replace_if_closed(kept)
    waiting = kept.__dict__.pop(OUTBOX, None)
    packed = kept.pack_commands(commands)
    try:
        kept.send_packed_command(packed if waiting is None else [*waiting[0], *packed])
    except redis.ConnectionError:  # nothing whole ran but what came first; a release runs twice harmlessly
        kept.disconnect()
        if due:  # their replies went with the connection: they may not have run
            owed.lost(owing)
            due, owing = 0, []
        if waiting is not None:  # written first, they may have reached Redis whole: never sent twice
            owed.lost(waiting[2])
            waiting = None
        places = [item for item in held if type(item) is Held]
        if len(places) < len(held):  # the same: the usage settled after the places may have run
            owed.lost([item for item in held if type(item) is not Held])
            held, commands = places, [command for command in commands if command[1] is RELEASE]
            packed = kept.pack_commands(commands)
        kept.send_packed_command(packed)
    count = len(commands)
    if waiting is not None:
        count, held = count + waiting[1], [*waiting[2], *held]
    setattr(kept, UNREAD, (socket_of(kept), due + count, [*owing, *held]))


class Carried:
    """Settled usage waiting on kept connections for their next write (decision_connection.OUTBOX), which
    carries it at no round trip of its own; what none took within a second is sent by a timer on a pooled
    connection, and what a process still holds at exit too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a thread adds to its connection's while the timer takes them all
        self._sending = threading.Lock()  # held while sending: the exit hook waits for the timer's send
        # the connections with settled usage waiting, held until the timer takes it (a pool reset meanwhile loses none)
        self._waiting: set[redis.Connection] = set()
        self._timer: threading.Timer | None = None

    def add(self, kept: redis.Connection, packed: list, count: int, items: Sequence[Adjustment]) -> None:
        with self._lock:
            before = kept.__dict__.get(OUTBOX)
            if before is not None:
                packed, count, items = [*before[0], *packed], before[1] + count, [*before[2], *items]
            kept.__dict__[OUTBOX] = (packed, count, list(items))
            self._waiting.add(kept)
            if self._timer is None:
                self._timer = threading.Timer(1.0, self.send)
                self._timer.daemon = True
                self._timer.start()

    def take(self) -> list[Adjustment]:
        """What waits on every connection, no longer waiting there: whoever takes it sends it."""
        with self._lock:
            self._timer = None
            waiting = [kept.__dict__.pop(OUTBOX, None) for kept in self._waiting]
            self._waiting = set()
        return [item for found in waiting if found is not None for item in found[2]]

    def send(self) -> None:
        with self._sending:
            items = self.take()
            if items:
                try:
                    breaker.call(lambda: send(client(), items))  # answered: a timer's thread ends at once
                except RedisUnavailable as error:
                    owed.add(items, error)

    def forget(self) -> None:
        self.take()

    def _forked(self) -> None:
        # a child's connections are its parent's, and what waits on them the parent's to send
        self._lock, self._sending = threading.Lock(), threading.Lock()
        self._waiting, self._timer = set(), None

    def _multiprocessing_child(self) -> None:
        # a multiprocessing child ends with os._exit, past atexit: its own exit hook sends
        multiprocessing.util.Finalize(None, self.send, exitpriority=10)


carried = Carried()
atexit.register(carried.send)
os.register_at_fork(after_in_child=carried._forked)
multiprocessing.util.register_after_fork(carried, Carried._multiprocessing_child)


decision_connection.replies_lost = owed.lost
