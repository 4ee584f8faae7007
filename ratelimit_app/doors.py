"""The door sequence, written once: enter -> decide -> view -> leave (docs/explanation/decision.md).
Plain code that yields its I/O: a sync door calls its @steps twin (`around_view.sync`), an async one
runs it with the async driver (drivers.py)."""

from __future__ import annotations

from typing import Iterable, NamedTuple

from django.urls import Resolver404, resolve

from . import closing, policies
from .boundary import MIDDLEWARE, Door, fail_open, faults, guarded, protected
from .conf import get_setting
from .drivers import Io, Steps, run, steps
from .limiter import Cost, RequestState, deciding, pending_checks
from .lru import BoundedCache, byte_bounded_cache, size_of
from .responses import answer, bare_refusal, refusal
from .subjects import SIMPLE_PARTS, addresses, http_request

STATE_ATTRIBUTE = "_ratelimit"  # the request's RequestState, in its HttpRequest's __dict__
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


def passed_drf_throttles(request) -> bool:
    """Whether `request` is a DRF Request: the view's throttles already ran, none will see it again."""
    return http_request(request) is not request


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
    _routes.unmatched.clear()


# the texts of a key counted by sys.getsizeof, not by length: a client's path of wide characters (4 bytes
# each in a str) or an invented method weighs what it holds
def _route_bytes(key: tuple, found: tuple) -> int:
    path, method, names = key
    return size_of(key, path, method, names, *names) + 64 * len(found[0]) + 128


def _unmatched_bytes(key: tuple, _index: object) -> int:
    path, method, urlconf = key
    return size_of(key, path, method) + (size_of(urlconf) if isinstance(urlconf, str) else 0)


def _checks_bytes(key: tuple, checks: list) -> int:
    route, address = key
    return (size_of(key, address or "") + _route_bytes(route, ((),))
            + sum(256 + len(check.subject.display) for check in checks))


class _Routes:
    """What the middleware found for a route under one policy index: the policies it matches, and when
    their subjects depend on the client's address alone (no override, no plan, no trusted proxy), their
    checks by address. Matching and computing subjects again gave the same answer for a few microseconds
    a request. Both are kept within their shares of RATELIMIT_CACHE_BYTES; a new index or a settings
    change starts afresh."""

    def __init__(self) -> None:
        self.index: object = None
        self.matched = BoundedCache("ratelimit_app.doors.route_policies", _route_bytes)
        self.checks = BoundedCache("ratelimit_app.doors.address_checks", _checks_bytes)
        # (path, method, urlconf) of the middleware's requests that no policy can meet -> the index that said so:
        # the next such request is answered by this one lookup (the middleware's), without resolving its route again
        self.unmatched = BoundedCache("ratelimit_app.doors.unmatched_routes", _unmatched_bytes)

    def matching(self, index, key: tuple, request) -> tuple[list, bool]:
        """The policies the route `key` matches, and whether their checks depend on the address alone."""
        if index is not self.index:
            self.forget()
            self.index = index
        found = self.matched.get(key)
        if found is None:
            matched = index.matching(path=request.path_info, names=key[2], method=request.method)
            found = self.matched.put(key, (matched, bool(matched) and _by_address(index, matched)))
        return found

    def nothing_for(self, index, request) -> None:
        """The middleware found no policy of `index` for the request's route: said at once while `index` is
        in force (the entry names it, so that one kept as another index came cannot count under it)."""
        self.unmatched.put((request.path_info, request.method, getattr(request, "urlconf", None)), index)

    def forget(self) -> None:
        self.index = None
        self.matched.clear()
        self.checks.clear()
        self.unmatched.clear()


_ADDRESS_READS = (SIMPLE_PARTS["ip"].read, SIMPLE_PARTS["global"].read)


def _by_address(index: policies.PolicyIndex, matched) -> bool:
    """Whether the checks of `matched` depend on the client's address (REMOTE_ADDR) alone."""
    trusted = addresses._trusted_proxies()
    if index.overrides or index.plans or trusted.networks or trusted.unix:  # a proxy's header names the client
        return False
    return all(part.read in _ADDRESS_READS for policy in matched for part in policy.key_spec)


_routes = _Routes()
_unmatched_route = _routes.unmatched.get  # the dict's own get: its entries are cleared in place, never replaced


def forget_checks() -> None:
    """A setting changed (trusted proxies, address grouping...): subjects are computed anew."""
    _routes.forget()


# --- the sequence ----------------------------------------------------------------------------------


@steps
def around_view(request, view: Io | None, door: Door, names: Iterable[str | None] = (), *, last: bool = True,
                cost: Cost | None = None, routed: bool = False, route: Route | None = None,
                answered=None) -> Steps:
    """enter -> decide -> view -> leave, for a door around a view: returns the response. The door's
    entering() (`names`, `last`, `cost`, `route`; `routed`: the middleware's, the route tells them). A request
    that raises (or is cancelled: its client left) gives its places back at once. Every step but the
    view's runs inside the boundary (entering() guards itself). `answered`: the view's response, when the
    middleware ran it itself (no policy meets its route) and the view made a state: what is left of the steps."""
    try:
        if answered is None:
            state = yield from entering(request, names, last=last, cost=cost, door=door, routed=routed,
                                        route=route)
            if state is not None and state.refused:
                try:
                    if state.closing is None:  # most refusals hold no place: no steps to give one back
                        return refusal(request, state)
                    return (yield from leaving(request, refusal(request, state), state))
                except Exception as error:  # noqa: BLE001 - the boundary (boundary.py): refused all the same
                    faults.record(error, door)
                    return bare_refusal(state)
            response = yield view
        else:
            state, response = None, answered
        if state is None:
            # made inside the view, by a door or hit(): state_now()'s lookup, a frame fewer on every request
            state = request.__dict__.get("_request", request).__dict__.get(STATE_ATTRIBUTE)
            if state is None:  # most requests of a site: no policy met them, nothing to answer for or give back
                return response
        try:
            if state.awaiting:  # the door inside never ran (DRF refused first): decide now
                yield from entering(request, (), last=True, door=door)
            if state.closing is None:  # most requests hold no place (no in-flight policy): nothing to give back
                return answer(request, response, state)
            return (yield from leaving(request, answer(request, response, state), state))
        except Exception as error:  # noqa: BLE001 - the boundary: the view's answer goes as it is
            faults.record(error, door)
            return response
    except GeneratorExit:  # dropped unfinished, which no driver does: nothing to give back from here
        raise
    except BaseException:
        yield from letting_go(request, door)
        raise


def undecided(request, error: Exception, door: Door) -> RequestState | None:
    """What a door's way in gives when the limiter failed (recorded): nothing (the request goes on
    undecided, fail open), or a state that refuses it with 503 (fail closed)."""
    faults.record(error, door, request)
    if fail_open():
        return None
    state = state_of(request)
    state.unavailable = state.refused = True
    state.awaiting = False
    return state


@steps
def entering(request, names, *, last: bool, cost: Cost | None = None, door: Door = MIDDLEWARE,
             routed: bool = False, route: Route | None = None) -> Steps:
    """A door's way in: gather the `names` it knows and the code's `cost` (the door nearer the view says
    last); the last door to see the request makes its one call. `routed`: the middleware's, whose
    names come from the route: no state on this app's admin pages or when no policy can apply (then
    a request costs nothing); a door that knows its view's `route` (the DRF throttle or @ratelimit, first
    to see the request) has it kept alike. Inside the boundary: a failure gives undecided()'s answer."""
    try:
        if not get_setting("RATELIMIT_ENABLED"):
            return None
        if routed:
            route = _resolve_route(request.path_info, getattr(request, "urlconf", None))  # route_of(), a frame fewer
            if route.exempt:
                return None
            names, last = route.names, not route.door_inside
        index = policies.fresh_index()
        if index is None:
            index = yield Io(policies.get_index, policies.aget_index)
        if not index.policies:
            if routed:
                _routes.nothing_for(index, request)
            return None
        matched = checks = None
        by_address = False
        if route is not None:
            # a DRF Request (the throttle's) hands on what it lacks through a raised AttributeError: its HttpRequest
            base = request.__dict__.get("_request", request)
            key = (base.path_info, base.method, names)
            # the route's entry read here (most requests): matching() only when it is not kept
            found = _routes.matched.get(key) if index is _routes.index else None
            matched, by_address = found or _routes.matching(index, key, base)
            if not matched:
                if routed:
                    _routes.nothing_for(index, base)
                return None
        # state_of(request, names) without its two calls: a route's door holds the HttpRequest already
        held = (base if route is not None else http_request(request)).__dict__
        state = held.get(STATE_ATTRIBUTE)
        if state is None:
            state = held[STATE_ATTRIBUTE] = RequestState(names)
        else:
            state.add_names(names)
        if route is not None:
            state.json_api = route.json_api
        if cost is not None:
            state.cost = cost
        state.awaiting = not last  # an outer door leaves the call to the door inside
        if last:
            if len(state.names) != len(names):  # a door before gathered other names: matched anew
                matched = None
            elif by_address and not state.decided:
                remembered = (key, base.META.get("REMOTE_ADDR"))
                checks = _routes.checks.get(remembered)
                if checks is None:
                    checks = _routes.checks.put(remembered, pending_checks(request, state, index, matched))
            if checks is not None:
                yield from deciding(request, state, index, extra=checks, pending=False)
            else:
                yield from deciding(request, state, index, matched=matched)
            state.refused = bool(state.denied) or state.unavailable
        return state
    except Exception as error:  # noqa: BLE001 - the boundary (boundary.py)
        return undecided(request, error, door)


def state_of(request, names: Iterable[str | None] = ()) -> RequestState:
    """The request's state (a DRF Request shares its HttpRequest's), with `names` gathered."""
    base = http_request(request)
    state = base.__dict__.get(STATE_ATTRIBUTE)
    if state is None:
        state = base.__dict__[STATE_ATTRIBUTE] = RequestState(names)
    else:
        state.add_names(names)
    return state


def state_now(request) -> RequestState | None:
    """The request's state, if a door or hit() made one."""
    return http_request(request).__dict__.get(STATE_ATTRIBUTE)


# --- what the request holds: sent by its closing step (closing.py) ---------------------------------


@steps
def leaving(request, response, state: RequestState | None = None) -> Steps:
    """The request's answer leaves a door: its closing step runs now, or as its streamed body ends."""
    if state is None:
        state = state_now(request)
    if state is None or state.closing is None:
        return response
    return (yield from closing.leaving(request, response, state.closing))


@steps
def letting_go(request, door: Door) -> Steps[None]:
    """The request failed (an exception, or its client left) before its answer left the door."""
    state = state_now(request)
    yield from closing.letting_go(None if state is None else state.closing, door)


def finish(request, response, door: Door):
    """leaving(), for the DRF throttle's view (sync, as DRF's finalize_response is)."""
    return run(guarded(leaving(request, response), door, lambda _error: response))
