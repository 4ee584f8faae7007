"""The one boundary between the limiter and the site, as Django's own handler is for views: every step
the limiter takes around a request (policies, plans, overrides and saved usage from the database,
settings, subjects, costs, Redis, metrics, signals) runs inside `guarded`, and no exception of its
own crosses it. It is logged once per kind per minute, counted, and the request follows
RATELIMIT_FAIL_OPEN; the view's own exceptions never pass through here."""

from __future__ import annotations

import logging
import threading
from typing import Callable, TypeVar

from . import metrics
from .conf import get_setting
from .drivers import Steps
from .subjects import http_request
from .loggate import LogGate
from .values import Unavailable

T = TypeVar("T")
logger = logging.getLogger("ratelimit_app")



class Door:
    """A way into the limiter (the middleware, @ratelimit, ...): every door is declared here, and the
    fault matrix (tests/faults/test_boundary.py) fails while a declared door has no row."""

    __slots__ = ("name",)
    declared: dict[str, Door] = {}

    def __init__(self, name: str) -> None:
        self.name = name
        Door.declared[name] = self

    def __repr__(self) -> str:
        return f"Door({self.name!r})"


MIDDLEWARE = Door("middleware")
DECORATOR = Door("decorator")
THROTTLE = Door("drf")
HIT = Door("hit")
CHECK = Door("check")
USAGE = Door("usage")
LIVE = Door("live")

# What the limiter reads and writes around a request: the fault matrix injects a real failure at each.
IO_POINTS = (
    "policies",  # the enabled policies (database)
    "overrides",  # per-subject overrides (database)
    "plans",  # plans and who is on them (database)
    "code_sync",  # rows written for policies declared in code (database)
    "saved_usage",  # a calendar quota's usage saved in the database, when Redis lost its period
    "usage_saver",  # the batched writes of quota usage (database)
    "decision",  # the request's one Redis call
    "give_back",  # places of requests in flight given back when a request ends (Redis)
    "tally",  # the totals and live index flushed in the background (Redis)
    "clock",  # Redis's clock, as the deny cache and the live page tell it
    "live_reads",  # the operator's reads of the live page (Redis)
    "setting",  # a RATELIMIT_* setting of the wrong type
)


class Faults:
    """Counts the limiter's faults by kind; logs a kind once per LOG_EVERY seconds, not per request."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last: dict[str, str] = {}  # kind -> the last error, as `ratelimit status` shows it
        self._said = LogGate()
        self._lock = threading.Lock()

    def record(self, error: BaseException, door: Door, request=None) -> None:
        """Count `error` met at `door`, and log it if its kind was not logged this minute. An outage of
        Redis (Unavailable) has its own log line and metric: it is not counted again here. Given the
        request, a second door meeting the same kind of fault for it counts nothing more."""
        if isinstance(error, Unavailable):
            return
        kind = f"{type(error).__module__}.{type(error).__qualname__}"
        if request is not None and _seen(request, kind):
            return
        text = _text(error)
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.last[kind] = f"{door.name}: {text}"[:300]
            count = self.counts[kind]
        metrics.record_fault(kind)
        if self._said.due(kind):
            logger.error("ratelimit: the limiter failed (%s, %d so far) at %s; %s: %s", kind, count, door.name,
                         _rule(), text, exc_info=error)

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.last.clear()
        self._said.reset()


faults = Faults()


FAULTS_ATTRIBUTE = "_ratelimit_faults"  # on an HttpRequest: the kinds of fault already counted for it


def _seen(request, kind: str) -> bool:
    """Whether a door counted `kind` for this request already (then marks it counted)."""
    attributes = getattr(http_request(request), "__dict__", None)
    if attributes is None:  # a stand-in for a request (DRF's own tests call throttles with one)
        return False
    found = attributes.setdefault(FAULTS_ATTRIBUTE, set())
    if kind in found:
        return True
    found.add(kind)
    return False


def _text(error: BaseException) -> str:
    """The error's text; recording it must not raise in its turn (an error whose __str__ fails)."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - the boundary: nothing it does may reach the site
        return f"<{type(error).__name__}: its text cannot be made>"


def _rule() -> str:
    return "letting requests through" if fail_open() else "refusing requests (503)"


def fail_open() -> bool:
    """RATELIMIT_FAIL_OPEN, read so that a broken settings module itself fails open."""
    try:
        return bool(get_setting("RATELIMIT_FAIL_OPEN"))
    except Exception:  # noqa: BLE001 - the rule must be known to apply it
        return True


def guarded(steps: Steps[T], door: Door, failed: Callable[[BaseException], T]) -> Steps[T]:
    """`steps`, with any exception of theirs recorded and turned into `failed(error)`: what the door
    answers under the failure rule. Cancellation and exits (BaseException) pass."""
    try:
        return (yield from steps)
    except Exception as error:  # noqa: BLE001 - the boundary: the site never sees the limiter's errors
        faults.record(error, door)
        return failed(error)


def protected(function: Callable[..., T], door: Door, failed: Callable[[BaseException], T]) -> Callable[..., T]:
    """`function` (no I/O of its own to yield) behind the boundary."""

    def call(*args, **kwargs) -> T:
        try:
            return function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - as in guarded
            faults.record(error, door)
            return failed(error)

    return call
