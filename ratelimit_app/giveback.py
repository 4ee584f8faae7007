"""Giving back the places of requests in flight (concurrency policies) when they end: one EVAL of
lua/release.lua per slot, written without waiting for its reply, and owed while Redis cannot take it."""

from __future__ import annotations

import logging
import threading
import weakref
from importlib import resources
from typing import Sequence

import redis
from asgiref.sync import sync_to_async

from . import keys
from .breaker import RedisUnavailable, breaker
from .connection import aclient, cluster_configured, is_cluster
from .decision_connection import decision_client
from .values import Held

logger = logging.getLogger("ratelimit_app")

# The script's code without its comments: EVAL hashes what it is sent, at every give-back.
RELEASE = "\n".join(
    line for line in resources.files(__package__).joinpath("lua", "release.lua").read_text(encoding="utf-8").splitlines()
    if line.strip() and not line.lstrip().startswith("--")
)
SKIP_REPLY = ("CLIENT", "REPLY", "SKIP")  # the next command's reply is not sent
UNREAD = "_ratelimit_unread"  # on a kept connection: (its socket, replies of give-backs not read yet)
ALL_READ = (None, 0)


def release(held: Sequence[Held]) -> None:
    """Give back the places requests held (they ended): one EVAL per slot (on one server: one in all),
    written without waiting for a reply. While Redis cannot take them (down, the circuit open) they
    are owed (Owed), never waited for."""
    held = owed.adding(held)
    if not held:
        return
    if breaker.open_until:  # open, or about to probe: the decisions probe, a give-back never waits
        return owed.add(held)
    try:
        breaker.call(lambda: send(decision_client(), held))
    except RedisUnavailable:
        owed.add(held)


async def arelease(held: Sequence[Held]) -> None:
    """release() for async code: only the write is awaited."""
    if cluster_configured():
        return await sync_to_async(release, thread_sensitive=False)(held)
    held = owed.adding(held)
    if not held:
        return
    if breaker.open_until:
        return owed.add(held)
    pool = aclient().connection_pool
    commands = [command for _, command in _release_commands(held, None)]

    async def send():
        connection = await pool.get_connection()
        try:
            skips = _skips.get(pool)
            if skips is None:
                skips = _skips[pool] = await _aprobe(connection)
            await connection.send_packed_command(connection.pack_commands(_unanswered(commands) if skips else commands))
            if not skips:
                for _ in commands:
                    await _aread_ignoring_errors(connection)
        finally:
            await pool.release(connection)

    try:
        await breaker.acall(send)
    except RedisUnavailable:
        owed.add(held)


class Owed:
    """Places whose give-back Redis could not take: sent with the next give-back, or by a timer within
    a second (which may probe an open circuit). Bounded: past LIMIT the oldest are dropped (logged),
    and their leases run out instead."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.places: list[Held] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def adding(self, held: Sequence[Held]) -> list[Held]:
        """`held` with what is owed (no longer owed: the caller sends it, or owes it again)."""
        if not self.places:
            return list(held)
        with self._lock:
            owed, self.places = self.places, []
        return owed + list(held)

    def add(self, held: Sequence[Held]) -> None:
        with self._lock:
            self.places += held
            if len(self.places) > self.LIMIT:
                dropped, self.places = self.places[: -self.LIMIT], self.places[-self.LIMIT:]
                logger.warning("ratelimit: %d places in flight not given back (their leases run out instead): %s",
                               len(dropped), breaker.cause)
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
                breaker.call(lambda: send(decision_client(), held))
            except RedisUnavailable:
                self.add(held)

    def forget(self) -> None:
        with self._lock:
            self.places = []


owed = Owed()


def send(redis_client, held: Sequence[Held]) -> None:
    if is_cluster(redis_client):
        for key, command in _release_commands(held, redis_client.keyslot):
            _send_unanswered(redis_client.get_node_from_key(key).redis_connection, [command])
    else:
        _send_unanswered(redis_client, [command for _, command in _release_commands(held, None)])


def _release_commands(held: Sequence[Held], slot_of) -> list[tuple[str, tuple]]:
    """(a key, the EVAL) for each slot the counters live in (`slot_of` None: one server, one EVAL)."""
    key_prefix = keys.prefix()
    groups: dict[int, tuple[list[str], list]] = {}
    for place in held:
        counter = keys.counter_key(place.policy, place.subject.key, key_prefix)
        counters, args = groups.setdefault(slot_of(counter) if slot_of else 0, ([], []))
        counters.append(counter)
        args += (place.lease, place.cost, place.policy.window_ms)
    return [(counters[0], ("EVAL", RELEASE, len(counters), *counters, *args)) for counters, args in groups.values()]


# pool -> whether its connections may run CLIENT REPLY SKIP (an ACL user may be refused CLIENT: then
# each reply is read before the connection goes back, or the next user of it would read it as its own)
_skips: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()
PROBE = ("CLIENT", "REPLY", "ON")  # changes nothing: replies are on on a pooled connection


def _probe(connection: redis.Connection) -> bool:
    connection.send_command(*PROBE)
    try:
        connection.read_response()
    except redis.ResponseError:
        return False
    return True


async def _aprobe(connection) -> bool:
    await connection.send_command(*PROBE)
    try:
        await connection.read_response()
    except redis.ResponseError:
        return False
    return True


def _read_ignoring_errors(connection: redis.Connection) -> None:
    try:
        connection.read_response()
    except redis.ResponseError:
        pass  # nothing to do about a give-back that failed: its lease runs out


async def _aread_ignoring_errors(connection) -> None:
    try:
        await connection.read_response()
    except redis.ResponseError:
        pass


def _unanswered(commands: Sequence[tuple]) -> list[tuple]:
    return [part for command in commands for part in (SKIP_REPLY, command)]


def _send_unanswered(redis_client: redis.Redis, commands: Sequence[tuple]) -> None:
    """Write `commands` and wait for no reply. On the thread's kept connection the replies are read
    later, before its next command (read_unread): they have long arrived by then. On a pooled
    connection CLIENT REPLY SKIP silences them, so it goes back to the pool with nothing to read; a
    user the server refuses CLIENT reads them instead."""
    kept = getattr(redis_client, "connection", None)
    if kept is None:
        pool = redis_client.connection_pool
        connection = pool.get_connection()  # checked by the pool before it lends it
        try:
            skips = _skips.get(pool)
            if skips is None:
                skips = _skips[pool] = _probe(connection)
            connection.send_packed_command(connection.pack_commands(_unanswered(commands) if skips else commands))
            if not skips:
                for _ in commands:
                    _read_ignoring_errors(connection)
        finally:
            pool.release(connection)
        return
    read_unread(kept)
    try:
        if kept._sock is not None and kept.can_read(timeout=0):
            kept.disconnect()  # nothing is due on it: the server closed it (idle timeout, CLIENT KILL)
    except redis.ConnectionError:
        kept.disconnect()
    packed = kept.pack_commands(commands)
    try:
        kept.send_packed_command(packed)
    except redis.ConnectionError:  # a write that failed ran nothing; a release runs twice harmlessly
        kept.disconnect()
        kept.send_packed_command(packed)
    setattr(kept, UNREAD, (kept._sock, len(commands)))


def read_unread(kept: redis.Connection) -> None:
    """Read the replies of the give-backs sent on `kept` that have arrived; if one has not (a busy
    server), the connection is closed rather than waited for: Redis still runs what it was sent."""
    sock, count = getattr(kept, UNREAD, ALL_READ)
    if not count:
        return
    setattr(kept, UNREAD, ALL_READ)
    if sock is not kept._sock:
        return  # reconnected since: those replies went with the old socket
    try:
        for _ in range(count):
            if not kept.can_read(timeout=0):
                kept.disconnect()
                return
            try:
                kept.read_response()
            except redis.ResponseError:
                pass  # nothing to do about a give-back that failed: its lease runs out
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        kept.disconnect()


def cleared(redis_client):
    """The decision client, its kept connection clear of the give-backs' replies."""
    kept = getattr(redis_client, "connection", None)
    if kept is not None and getattr(kept, UNREAD, ALL_READ)[1]:
        read_unread(kept)
    return redis_client
