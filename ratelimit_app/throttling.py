"""PolicyThrottle: policies enforced inside DRF, where token-authenticated users are known; with the
middleware in front, it makes the request's one call (doors.py)."""

from __future__ import annotations

import logging

from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.throttling import BaseThrottle

from . import headers
from .boundary import THROTTLE
from .doors import STATE_ATTRIBUTE, Route, entering, finish, letting_go
from .drivers import run
from .lru import byte_bounded_cache
from .registry import fixed_cost_problem
from .responses import UNAVAILABLE_MESSAGE, UNAVAILABLE_RETRY_AFTER

logger = logging.getLogger("ratelimit_app")
_made = tuple.__new__  # Route(...) runs the named tuple's Python __new__ on every request; this does not


class RateLimitUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = UNAVAILABLE_MESSAGE
    default_code = "ratelimit_unavailable"
    wait = UNAVAILABLE_RETRY_AFTER  # DRF's exception handler turns this into Retry-After


def _give_back_when_finalized(view, request) -> None:
    """Places in flight go back as DRF finalizes the response (or at once when the view raises what
    DRF does not handle): this view instance's two steps are wrapped, for this request only."""
    finalize, handle_exception = view.finalize_response, view.handle_exception

    def finalize_response(request, response, *args, **kwargs):
        return finish(request, finalize(request, response, *args, **kwargs), THROTTLE)

    def handle(exc):
        try:
            return handle_exception(exc)
        except BaseException:
            run(letting_go(request, THROTTLE))
            raise

    view.finalize_response, view.handle_exception = finalize_response, handle


def is_last(throttle, view) -> bool:
    """Whether this PolicyThrottle is the last of the view's: DRF runs them in order, the last decides."""
    mine, seen, last = type(throttle), False, None
    for door in getattr(view, "throttle_classes", ()):  # a loop, not a list made on every request
        if getattr(door, "ratelimit_door", False):
            last = door
            seen = seen or door is mine
    return last is None or last is mine or not seen


def view_cost(view):
    """What a DRF view says a request costs: `get_throttle_cost(request)` (called inside the limiter's
    boundary, as it decides), or `throttle_cost`; None: nothing.

    A `throttle_cost` that is not a whole number of at least 1 (check ratelimit_app.E018) is not used,
    with a logged error: the request costs what it would without it, never a 500."""
    get_cost = getattr(view, "get_throttle_cost", None)
    if get_cost is not None:
        return get_cost
    cost = getattr(view, "throttle_cost", None)
    if cost is None:
        return None
    problem = fixed_cost_problem(cost)
    if problem is None:
        return cost
    _refuse_cost(type(view), repr(cost), problem)
    return None


@byte_bounded_cache(entry_bytes=1024)  # a view class and two short texts
def _refuse_cost(view_class: type, cost: str, problem: str) -> None:
    """Said once per view and value, not on every request."""
    logger.error(
        "ratelimit: %s.%s.throttle_cost = %s is not used: %s; a cost is a whole number of units, at least 1 "
        "(system check ratelimit_app.E018). Its requests cost 1 unit (or the admin's action cost) until it is fixed.",
        view_class.__module__, view_class.__qualname__, cost, problem,
    )


def _names(scope: str | None, view_name: str | None) -> tuple[str, ...]:
    """The names a view's policies may match, each once (as a request's state gathers them)."""
    if not scope or scope == view_name:
        return (view_name,) if view_name else ()
    return (scope, view_name) if view_name else (scope,)


class PolicyThrottle(BaseThrottle):
    """A DRF throttle that enforces the policies written in the admin (or in code) on DRF views.

    It matches the view's `throttle_scope`, the URL name, path prefixes and `*`, and runs after DRF's
    authentication, so policies keyed by `user` or `user_or_ip` count token- and session-authenticated
    users alike. Set it for every view, or per view in `throttle_classes`::

        REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": ["ratelimit_app.throttling.PolicyThrottle"]}

    A refused request gets a 429 with `Retry-After`; with `RateLimitMiddleware` installed, the app's
    body (the limit, the policy, when to retry) in place of DRF's, and the `RateLimit` headers. A
    view's `throttle_cost = N` or `get_throttle_cost(request)` makes a request count N units. With Redis
    unreachable and `RATELIMIT_FAIL_OPEN = False`, the request is answered 503. Without DRF installed,
    importing this module fails; nothing else needs it.
    """

    ratelimit_door = True  # tells the middleware that this throttle will see the request

    def allow_request(self, request, view) -> bool:
        base = request.__dict__.get("_request", request)  # DRF's Request hands on the rest through an AttributeError
        match = getattr(base, "resolver_match", None)
        names = _names(getattr(view, "throttle_scope", None), match.view_name if match else None)
        last = is_last(self, view)
        # the first door of the request: its route's policies and checks are kept, as the middleware's are
        route = _made(Route, (names, False, True, False)) if STATE_ATTRIBUTE not in base.__dict__ else None
        self.state = entering.sync(request, names, last=last, cost=view_cost(view), route=route, door=THROTTLE)
        if self.state is None:
            return True
        if self.state.closing is not None:
            _give_back_when_finalized(view, request)
        if self.state.unavailable:
            raise RateLimitUnavailable()
        return not self.state.denied

    def wait(self) -> float | None:
        return headers.retry_after(self.state.denied) if self.state and self.state.denied else None
