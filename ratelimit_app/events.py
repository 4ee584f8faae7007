"""Signals for a project's own alerting: a request was denied; Redis became unavailable, or available again;
and the log of requests decided without Redis. Receivers run in the request that caused the event; one
that raises is logged, never breaks the request."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Sequence

from django.dispatch import Signal

from . import engine, metrics
from .conf import get_setting
from .drivers import Io, Steps, arun, run
from .loggate import LogGate
from .engine import RedisCommandError, RedisUnavailable
from .subjects import http_request

if TYPE_CHECKING:
    from django.http import HttpRequest

    from .values import Decision

logger = logging.getLogger("ratelimit_app")
OUTAGE_ATTRIBUTE = "_ratelimit_outage"

#: Sent once per denied request (sender: the Policy model) with `request`, `policy` (its name),
#: `subject` (as the admin shows it, secrets masked), `limit` and `retry_after` (seconds), from the
#: policy that makes the client wait longest; `decisions` holds every denying decision.
request_denied = Signal()

#: Sent (sender None) when this process finds Redis unavailable, with `error` (the exception).
redis_unavailable = Signal()

#: Sent (sender None) when this process reaches Redis again, with `unavailable_for` (seconds).
redis_available = Signal()


def _policy_model() -> type:
    from .models import Policy  # at call time: this module is imported on the request path, before models may be

    return Policy


def _denied_kwargs(request: HttpRequest, decisions: Sequence[Decision]) -> dict:
    longest = max(decisions, key=lambda decision: decision.retry_after or 0)
    return {
        "request": request,
        "policy": longest.policy.name,
        "subject": longest.subject.display,
        "limit": longest.limit,
        "retry_after": longest.retry_after,
        "decisions": tuple(decisions),
    }


receiver_failed_said = LogGate()  # per signal and class of error: a receiver failing at every refusal


def _log_failures(signal_name: str, responses: list) -> None:
    for _receiver, response in responses:
        if isinstance(response, Exception) and receiver_failed_said.due(f"{signal_name}:{type(response)!r}"):
            logger.error("ratelimit: a receiver of %s failed: %r", signal_name, response, exc_info=response)


def denied(request: HttpRequest, decisions: Sequence[Decision]) -> None:
    """Send request_denied for a request refused by `decisions` (the enforcing ones over their limit).
    Costs one attribute check when nothing listens."""
    if request_denied.receivers and decisions:
        run(_denying(request, decisions))


async def adenied(request: HttpRequest, decisions: Sequence[Decision]) -> None:
    """denied() for the async path: async receivers are awaited, sync ones run in a thread."""
    if request_denied.receivers and decisions:
        await arun(_denying(request, decisions))


def _denying(request: HttpRequest, decisions: Sequence[Decision]) -> Steps[None]:
    kwargs = {"sender": _policy_model(), **_denied_kwargs(request, decisions)}
    _log_failures("request_denied", (yield Io(request_denied.send_robust, request_denied.asend_robust, (), kwargs)))


class Availability:
    """Whether this process last found Redis available; each change is sent once, not per request."""

    def __init__(self) -> None:
        self.lost_at: float | None = None  # monotonic time of the first failure, while unavailable
        self._lock = threading.Lock()

    def lost(self, error: BaseException) -> None:
        with self._lock:
            if self.lost_at is not None:
                return
            self.lost_at = time.monotonic()
        metrics.breaker_opened()
        logger.warning("ratelimit: Redis became unavailable: %s", error)
        _log_failures("redis_unavailable", redis_unavailable.send_robust(sender=None, error=error))

    def reset(self) -> None:
        """Available, as a process starts (tests): the next loss is logged and signalled again."""
        with self._lock:
            self.lost_at = None

    def found(self) -> None:
        with self._lock:
            if self.lost_at is None:
                return
            unavailable_for, self.lost_at = time.monotonic() - self.lost_at, None
        metrics.breaker_closed()
        logger.warning("ratelimit: Redis is available again after %.1f s", unavailable_for)
        _log_failures("redis_available", redis_available.send_robust(sender=None, unavailable_for=unavailable_for))


availability = Availability()


def breaker_opened(error: BaseException) -> None:
    """Call when the circuit breaker opens after a Redis error (repeated calls send nothing more)."""
    availability.lost(error)


def breaker_closed() -> None:
    """Call when a Redis call succeeds after the breaker was open (repeated calls send nothing more)."""
    availability.found()


# the engine's circuit breaker reports through these (it imports nothing above it)
engine.hooks.circuit_opened, engine.hooks.circuit_closed = breaker_opened, breaker_closed


class Outage:
    """Counts requests let through or refused because Redis could not decide; logs once per interval."""

    def __init__(self) -> None:
        self.requests = 0
        self._logged_at = 0.0
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Log the next request let through or refused at once (tests start from here)."""
        self._logged_at = 0.0

    def record(self, error: RedisUnavailable, request: object = None) -> None:
        """Count one request; given the request, a second door reporting the same request adds nothing."""
        if request is not None:
            base = http_request(request)
            if base.__dict__.get(OUTAGE_ATTRIBUTE):
                return
            base.__dict__[OUTAGE_ATTRIBUTE] = True
        with self._lock:
            self.requests += 1
            now = time.monotonic()
            if now - self._logged_at < get_setting("RATELIMIT_BREAKER_SECONDS"):
                return
            self._logged_at = now
        action = "letting requests through" if get_setting("RATELIMIT_FAIL_OPEN") else "refusing requests (503)"
        what = "Redis could not decide a request" if isinstance(error, RedisCommandError) else "Redis unavailable"
        logger.warning("ratelimit: %s, %s (%d so far): %s", what, action, self.requests, error)


outage = Outage()
