"""The circuit breaker of the request path, and the errors the doors see: one place that knows Redis
can fail. A small state machine (closed, open, half-open) that knows nothing of connections."""

from __future__ import annotations

import logging
import os
import threading
import time
from types import TracebackType
from typing import Awaitable, Callable, NoReturn, TypeVar

import redis

from ..conf import get_setting
from ..values import Unavailable
from .hooks import Hooks, hooks

T = TypeVar("T")
logger = logging.getLogger("ratelimit_app")


class RedisUnavailable(Unavailable):
    """Redis could not decide (down, timed out, the circuit is open, or it answered with an error);
    the doors apply RATELIMIT_FAIL_OPEN."""


class RedisCommandError(RedisUnavailable):
    """Redis is up but gave this call no answer to use: an error reply (WRONGTYPE, READONLY, a Lua
    error), a reply lost with its connection, or no connection free in the pool. Not an outage,
    nothing decided."""


class ReplyLost(redis.ConnectionError):
    """Redis or a proxy closed the connection after the command was written (CLIENT KILL, a restart
    under way): it may have run, so it is not sent again; the next call takes a new connection."""


class PoolFull(redis.ConnectionError):
    """Every connection the pool allows (max_connections) stayed in use for as long as a reply may
    take: the site's own back-pressure, not Redis failing."""


# errors that say nothing of whether Redis is up: they fail one call, and never open the circuit
NOT_OUTAGES = (redis.ResponseError, ReplyLost, PoolFull, redis.exceptions.MaxConnectionsError)


def is_outage(error: redis.RedisError) -> bool:
    """Redis did not answer (refused, timed out, cluster down); an error reply, a lost reply or a full
    pool is no outage, nor a slot whose keys a resharding is moving (TRYAGAIN: that shard's calls fail
    alone)."""
    if isinstance(error, redis.exceptions.ClusterDownError):
        return True
    return not isinstance(error, NOT_OUTAGES)


def describe(error: BaseException) -> str:
    """The error as a log line: redis-py names the address ('Error 111 connecting to 127.0.0.1:6390');
    the code it strips from an error reply ('READONLY', 'WRONGTYPE'...) is put back in front."""
    code = getattr(error, "status_code", None)
    message = str(error)
    if code and not message.startswith(code):
        message = f"{code} {message}"
    return f"{type(error).__name__}: {message}"


class CircuitBreaker:
    """After Redis failed to answer, fail fast for a while instead of adding a timeout to every request.

    Closed: calls go to Redis. Open, for RATELIMIT_BREAKER_SECONDS after an outage: calls fail at once
    with the outage's cause. Half-open, then: one call probes Redis while the others keep failing at
    once; its answer closes the circuit, its failure opens it again. An error Redis answers with is
    no outage (it costs no timeout): it is logged with its message, counted in `errors`, and leaves
    the circuit closed.
    """

    def __init__(self, hooks: Hooks | None = None) -> None:
        self.hooks = hooks or Hooks()  # who is told that the circuit opened or closed
        self.open_until = 0.0
        self.failures = 0  # outages seen (refused, timed out), for monitoring
        self.errors = 0  # errors Redis answered with, for monitoring
        self.cause = ""  # the last outage, named by the calls that fail fast meanwhile
        self._probe = threading.Lock()
        # what takes connections anew after an outage or a failover (set by decision_connection.py)
        self.reconnect: Callable[[redis.RedisError], None] = lambda error: None
        self._count = threading.Lock()
        self._error_logged_at = 0.0

    def call(self, operation: Callable[[], T]) -> T:
        with Attempt(self):
            return operation()

    async def acall(self, operation: Callable[[], Awaitable[T]]) -> T:
        """call() for the asyncio client: the same circuit, shared by sync and async requests."""
        with Attempt(self):
            return await operation()

    def _admit(self) -> bool:
        """Whether this call may go to Redis (raises RedisUnavailable if not); True when it is the
        half-open circuit's one probe, which holds the probe lock until it has an answer."""
        if not self.open_until:
            return False
        if time.monotonic() < self.open_until or not self._probe.acquire(blocking=False):
            raise RedisUnavailable(self.cause)
        return True

    def _failed(self, error: redis.RedisError) -> NoReturn:
        if is_outage(error):
            self._open(error)
            raise RedisUnavailable(self.cause) from error
        self._closed()  # Redis answered: it is up
        self._answered_with(error)
        raise RedisCommandError(describe(error)) from error

    def _open(self, error: redis.RedisError) -> None:
        with self._count:
            self.failures += 1
            self.cause = describe(error)
            self.open_until = time.monotonic() + get_setting("RATELIMIT_BREAKER_SECONDS")
        # connections are taken anew, which finds the server anew (a Sentinel's new master)
        self.reconnect(error)
        self.hooks.circuit_opened(error)

    def _closed(self) -> None:
        if self.open_until:  # the first answer after an outage
            self.open_until = 0.0
            self.hooks.circuit_closed()

    def _answered_with(self, error: redis.RedisError) -> None:
        with self._count:
            self.errors += 1
            now = time.monotonic()
            if now - self._error_logged_at < get_setting("RATELIMIT_BREAKER_SECONDS"):
                return
            self._error_logged_at = now
        logger.error("ratelimit: Redis gave a call no answer to use (%d so far): %s", self.errors, describe(error))
        if isinstance(error, redis.ReadOnlyError):
            self.reconnect(error)  # a replica after a failover: a new connection may reach the new primary

    def _forked(self) -> None:
        # a probe or a count under way in a thread of the parent: the child has no such thread to release them
        self._probe, self._count = threading.Lock(), threading.Lock()

    def reset(self) -> None:
        """Close the circuit, and log the next error at once (tests start from here)."""
        self.open_until = 0.0
        self._error_logged_at = 0.0


class Attempt:
    """One call through the circuit, as a `with` block around it (the same for sync and async calls):
    refused at once while the circuit is open; its answer or its failure moves the circuit. The request
    path's decision writes `with Attempt(breaker):` itself, sparing a closure and a coroutine a request."""

    __slots__ = ("circuit", "probing")

    def __init__(self, circuit: CircuitBreaker) -> None:
        # the closed circuit (every call but those after an outage) is told by one attribute read
        self.circuit, self.probing = circuit, bool(circuit.open_until) and circuit._admit()

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: TracebackType | None) -> None:
        try:
            if isinstance(error, redis.RedisError):
                self.circuit._failed(error)  # raises; the circuit is open again before the probe lock goes
        finally:
            if self.probing:
                self.circuit._probe.release()
        if error is None and self.circuit.open_until:
            self.circuit._closed()


breaker = CircuitBreaker(hooks)
os.register_at_fork(after_in_child=breaker._forked)
