"""Which door decides what. A request is decided in ONE Redis call, all-or-nothing, whatever doors see it.

The doors, outermost first: RateLimitMiddleware, @ratelimit on the view, PolicyThrottle inside DRF.

1. Every door adds the names it knows (the URL name, a DRF view's throttle_scope, the decorator's
   action) to the request's pending names. '*' and path prefix policies are always pending.
2. The LAST door that sees the request makes the one call, for everything pending. The middleware
   knows from the resolved view whether a door inside will see the request (the view carries
   @ratelimit, or is a DRF view throttled by PolicyThrottle); if so it only gathers and waits.
   A door inside decides with the request as it knows it: DRF's throttle with DRF's user, so a
   token user is counted as that user by `user` and `user_or_ip` policies.
3. If the door inside never runs (DRF refused the request before its throttles: failed
   authentication, permissions, 405), the outer door (the middleware, or @ratelimit around a DRF
   view) decides on the way out, so such requests still count against per-address policies, and a
   denial replaces the response with the 429.
4. A refusal by any door comes from responses.refusal: one shape for every door. A refusal made inside
   the view goes out through the middleware inside RateLimitMiddleware like any answer; one that
   replaces a response (DRF's 429) keeps the headers and cookies that middleware added to it.
5. Once the call is made, the request's policies are decided: a later hit() in the view decides only
   policies not decided yet, in a call of its own.
6. This app's own admin pages are never counted or refused (the operator cannot be locked out by the
   policies being fixed); the admin login stays protected.
7. Places taken in in-flight (concurrency) policies go back when the request ends, whatever answer the
   server finally sends: the first door the answer leaves gives them back before it is sent (finish),
   a streamed body's when it ends, is closed or is dropped unsent; a request that raises, or is
   cancelled because its client left, gives them back at once (let_go). They are recorded before the
   call that takes them is sent, so a call left unanswered (timed out, cancelled) is given back too.
   What no door gave back (hit() in a view of a site without the middleware) goes back when the
   request ends (request_finished).
"""

from __future__ import annotations

import logging
import weakref
from typing import NamedTuple, Sequence

from django.urls import Resolver404, resolve

from . import headers, policies
from .conf import get_setting
from .engine import giveback
from .lru import byte_bounded_cache
from .limiter import STATE_ATTRIBUTE, Cost, RequestState, adecide, decide, holding_now, state_of
from .responses import is_refusal, refusal
from .subjects import http_request
from .values import Held

logger = logging.getLogger("ratelimit_app")
ADMIN_PAGES = "ratelimit_app_"  # URL names of this app's admin pages, in the admin's namespace


class Route(NamedTuple):
    """What the middleware needs to know of the view a path resolves to."""

    names: tuple[str, ...]  # URL name, DRF throttle_scope, @ratelimit actions
    door_inside: bool  # @ratelimit or PolicyThrottle will see the request after the middleware
    json_api: bool  # a DRF view: its clients expect JSON
    exempt: bool  # one of this app's admin pages


NOWHERE = Route((), False, False, False)


def is_policy_throttled(view_class: type | None) -> bool:
    """Whether a DRF view runs a PolicyThrottle (marked `ratelimit_door`), without importing DRF."""
    classes = getattr(view_class, "throttle_classes", None) or ()
    return any(getattr(c, "ratelimit_door", False) for c in classes)


def has_decorator_inside(view) -> bool:
    """Whether calling `view` meets an inner @ratelimit."""
    return bool(getattr(view, "ratelimit_actions", None))


def has_throttle_inside(view) -> bool:
    """Whether `view` belongs to a DRF view run by a PolicyThrottle (which only sees requests DRF has not
    yet wrapped: a method such as `get` gets a DRF Request after the throttles ran)."""
    owner = getattr(view, "cls", None) or getattr(view, "view_class", None)
    if owner is None:  # method_decorator hands decorators a partial of the bound method
        instance = getattr(getattr(view, "func", view), "__self__", None)
        owner = type(instance) if instance is not None else None
    return is_policy_throttled(owner)


@byte_bounded_cache(2 << 20)  # a client inventing paths only evicts entries; resolving again is always right
def _resolve_route(path: str, urlconf: str | None) -> Route:
    try:
        match = resolve(path, urlconf)
    except Resolver404:
        return NOWHERE
    view_class = getattr(match.func, "cls", None) or getattr(match.func, "view_class", None)
    actions = getattr(match.func, "ratelimit_actions", ())
    names = tuple(n for n in (match.view_name, getattr(view_class, "throttle_scope", None), *actions) if n)
    exempt = match.namespace == "admin" and (match.url_name or "").startswith(ADMIN_PAGES)
    drf = getattr(match.func, "cls", None) is not None
    return Route(names, bool(actions) or is_policy_throttled(view_class), drf, exempt)


def route_of(request) -> Route:
    return _resolve_route(request.path_info, getattr(request, "urlconf", None))


def forget_routes() -> None:
    """The URLconf changed: views are resolved again."""
    _resolve_route.cache_clear()


# --- the middleware: first in, last out ---------------------------------------------------------


def _enter(request, index: policies.PolicyIndex) -> RequestState | None:
    """The middleware's way in: the request's state with the names of its route; None when exempt or
    when no policy can apply (then a request costs no state and no call)."""
    route = route_of(request)
    if route.exempt or not index.matching(path=request.path_info, names=route.names, method=request.method):
        return None
    state = state_of(request)
    state.add_names(route.names)
    state.json_api = route.json_api
    state.awaiting = route.door_inside  # a door inside will make the call
    return state


def _answer(request, response, state: RequestState | None):
    """The response as it leaves: the refusal when a door refused, else the view's with the headers."""
    if state is None:
        return response
    if state.refused:
        if is_refusal(response):
            return response  # a door inside answered: its refusal came out through the middleware inside, keep it
        refused = refusal(request, state)
        return response if refused is None else _replacing(refused, response)
    headers.apply(response, state.decisions)
    return response


# What the replaced response says about its own body or its own status, not about the site.
NOT_CARRIED = frozenset({"content-type", "content-length", "content-encoding", "content-language", "www-authenticate"})


def _replacing(refused, response):
    """`refused` in place of `response`, with what the middleware inside added to that (X-Frame-Options,
    Vary, cookies): DRF's refusal, or the view's answer to a request refused on the way out."""
    for name, value in response.headers.items():
        if name.lower() not in NOT_CARRIED and name not in refused.headers:
            refused.headers[name] = value
    for name, morsel in response.cookies.items():
        refused.cookies.setdefault(name, morsel)
    refused._resource_closers.extend(response._resource_closers)  # what was to run when it closed
    return refused


def _refuse_if_denied(state: RequestState) -> RequestState:
    state.refused = bool(state.denied) or state.unavailable
    return state


def middleware_request(request):
    """On the way in: decide now, or leave the call to a door inside. Returns a refusal or None."""
    if not get_setting("RATELIMIT_ENABLED"):
        return None
    index = policies.get_index()
    if not index:
        return None
    state = _enter(request, index)
    if state is None or state.awaiting:
        return None
    return refusal(request, _refuse_if_denied(decide(request, state, index)))


def middleware_response(request, response):
    """On the way out: decide what no door inside decided (DRF refused before its throttles); headers."""
    state: RequestState | None = request.__dict__.get(STATE_ATTRIBUTE)
    if state is None:
        return response
    return finish(request, _answer(request, response, decide_left_over(request, state)), state)


def decide_left_over(request, state: RequestState | None) -> RequestState | None:
    """An outer door on the way out: make the call a door inside was left, if that door never ran."""
    if state is not None and state.awaiting:
        state.awaiting = False
        _refuse_if_denied(decide(request, state))
    return state


async def amiddleware_request(request):
    """middleware_request() on an async stack, through the asyncio Redis client."""
    if not get_setting("RATELIMIT_ENABLED"):
        return None
    index = policies.fresh_index()
    if index is None:
        index = await policies.aget_index()
    if not index:
        return None
    state = _enter(request, index)
    if state is None or state.awaiting:
        return None
    return refusal(request, _refuse_if_denied(await adecide(request, state, index)))


async def amiddleware_response(request, response):
    state: RequestState | None = request.__dict__.get(STATE_ATTRIBUTE)
    if state is None:
        return response
    if state.awaiting:  # most requests were decided on the way in: no coroutine to await here
        await adecide_left_over(request, state)
    return await afinish(request, _answer(request, response, state), state)


async def adecide_left_over(request, state: RequestState | None) -> RequestState | None:
    if state is not None and state.awaiting:
        state.awaiting = False
        _refuse_if_denied(await adecide(request, state))
    return state


# --- the doors inside the view ------------------------------------------------------------------


def policy_throttle_is_last(throttle, view) -> bool:
    """Whether this PolicyThrottle is the last of the view's: DRF runs them in order, the last decides."""
    doors = [c for c in getattr(view, "throttle_classes", ()) if getattr(c, "ratelimit_door", False)]
    return not doors or type(throttle) is doors[-1] or type(throttle) not in doors


def _gather(request, names, cost: Cost | None) -> RequestState | None:
    if not get_setting("RATELIMIT_ENABLED"):
        return None
    state = state_of(request)
    state.add_names(names)
    if cost is not None:
        state.cost = cost
    return state


def inner_door(request, names, *, last: bool, cost: Cost | None = None) -> RequestState | None:
    """A decorator's or a throttle's turn: gather `names` (and the code's `cost`: the door inside, the
    nearer the view, says last); the last door inside makes the call.

    A door that is not last leaves the call to the door inside, and must call decide_left_over() with
    the view's response: DRF may refuse the request before its throttles run.
    """
    state = _gather(request, names, cost)
    if state is None:
        return state
    if not last:
        state.awaiting = True
        return state
    state.awaiting = False
    return _refuse_if_denied(decide(request, state))


async def ainner_door(request, names, *, last: bool, cost: Cost | None = None) -> RequestState | None:
    state = _gather(request, names, cost)
    if state is None:
        return state
    if not last:
        state.awaiting = True
        return state
    state.awaiting = False
    return _refuse_if_denied(await adecide(request, state))


# --- places in flight --------------------------------------------------------------------------


def _taken(request, state: RequestState | None = None) -> list[Held]:
    """The places the request holds, now no longer its own to give back (each is given back once)."""
    if state is None:
        state = http_request(request).__dict__.get(STATE_ATTRIBUTE)
    if state is None or not state.held:
        return []
    held, state.held = state.held, []
    return held


def finish(request, response, state: RequestState | None = None):
    """The request's answer leaves a door: its places go back now, before a byte of it is sent, so
    that a client's next request never finds them taken. A streamed body is still to come: then when
    it ends or is closed, or when the response is dropped unsent (an outer middleware answered
    instead, e.g. ConditionalGetMiddleware's 304)."""
    held = _taken(request, state)
    if held:
        if getattr(response, "streaming", False):
            _when_streamed(response, _Places(held))
        else:
            give_back(held)
    return response


async def afinish(request, response, state: RequestState | None = None):
    """finish() on an event loop."""
    held = _taken(request, state)
    if held:
        if getattr(response, "streaming", False):
            _when_streamed(response, _Places(held))
        else:
            await agive_back(held)
    return response


class _Places:
    """A streamed response's places: given back once, by the first of its body's end, its close, or
    the end of the response object (dropped without being closed)."""

    __slots__ = ("held",)

    def __init__(self, held: list[Held]) -> None:
        self.held = held

    def take(self) -> list[Held]:
        held, self.held = self.held, []
        return held

    def __call__(self) -> None:
        give_back(self.take())


def _when_streamed(response, places: _Places) -> None:
    if getattr(response, "file_to_stream", None) is None:  # a file is sent by the server's file wrapper
        # the chunks as the view gave them (streaming_content would tie the response to itself: a cycle
        # that keeps a dropped response, and its places, until the collector runs)
        chunks = response._iterator
        response.streaming_content = _aended(chunks, places) if response.is_async else _ended(chunks, places)
    response._resource_closers.append(places)
    weakref.finalize(response, places).atexit = False


def _ended(content, places: _Places):
    try:
        yield from content
    finally:  # the last chunk was produced (the server has yet to end the body), or the body was closed
        places()


async def _aended(content, places: _Places):
    try:
        async for chunk in content:
            yield chunk
    finally:
        await agive_back(places.take())


def let_go(request) -> None:
    """The request failed (an exception) before its answer left the door: its places go back now."""
    give_back(_taken(request))


async def alet_go(request) -> None:
    """The request failed, or was cancelled because its client left: its places go back now."""
    await agive_back(_taken(request))


def request_began(**kwargs) -> None:
    """request_started: the states that take places from now on are this request's (limiter.asking)."""
    holding_now.set([])


def request_ended(**kwargs) -> None:
    """request_finished (the server closed the response, or the client left): what no door gave back
    goes back now, e.g. places taken by hit() on a site without the middleware."""
    holders = holding_now.get()
    if holders:
        held = [place for state in holders for place in _taken(None, state)]
        holders.clear()
        give_back(held)


def give_back(held: Sequence[Held]) -> None:
    if held:
        giveback.release(held)


async def agive_back(held: Sequence[Held]) -> None:
    if held:
        await giveback.arelease(held)


def passed_drf_throttles(request) -> bool:
    """Whether `request` is a DRF Request: the view's throttles already ran, none will see it again."""
    return http_request(request) is not request
