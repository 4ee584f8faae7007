"""RateLimitMiddleware: every request, by URL name, path prefix, '*' and method (the sequence: doors.py).
Sync and async: on an ASGI stack it runs without a thread hop, through the asyncio Redis client."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from .boundary import MIDDLEWARE, faults
from .doors import STATE_ATTRIBUTE, _unmatched_route, around_view, letting_go
from .drivers import Io, arun
from .policies import fresh_index
from .responses import service_unavailable
from .values import Unavailable

# Io(...) runs the named tuple's Python __new__ (its defaults) on every request; the tuple made directly does not
_made = tuple.__new__
_NO_KWARGS: dict = {}


class RateLimitMiddleware:
    """Enforces the policies that match every request: by URL name, path prefix, `*` and method.

    Add it to `MIDDLEWARE` right after `AuthenticationMiddleware`, so that policies counted per user
    see the user (a system check says when it is not)::

        MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
                          "ratelimit_app.middleware.RateLimitMiddleware")

    A request over an enforced policy is answered 429 with `Retry-After`, before the view runs; every
    response under an enforced policy carries the `RateLimit-Policy` and `RateLimit` headers. Places
    of policies of requests in flight are given back when the response is done. With `@ratelimit` or
    `PolicyThrottle` on the view as well, the request still makes one Redis call. It works under WSGI
    and ASGI alike; under ASGI it runs on the event loop with redis-py's asyncio client.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        if not _known_unmatched(request):
            view = _made(Io, (self.get_response, self.get_response, (request,), _NO_KWARGS))
            return around_view.sync(request, view, MIDDLEWARE, routed=True)
        try:
            response = self.get_response(request)
        except BaseException:
            letting_go.sync(request, MIDDLEWARE)  # a state made inside the view gives its places back
            raise
        state = request.__dict__.get(STATE_ATTRIBUTE)
        if state is None:  # most requests of a site: no policy met them, nothing to answer for or give back
            return response
        return around_view.sync(request, None, MIDDLEWARE, answered=response)  # made inside the view: hit(), a door

    async def _acall(self, request):  # __call__'s twin
        if not _known_unmatched(request):
            view = _made(Io, (self.get_response, self.get_response, (request,), _NO_KWARGS))
            return await arun(around_view(request, view, MIDDLEWARE, routed=True))
        try:
            response = await self.get_response(request)
        except BaseException:
            await arun(letting_go(request, MIDDLEWARE))
            raise
        state = request.__dict__.get(STATE_ATTRIBUTE)
        if state is None:
            return response
        return await arun(around_view(request, None, MIDDLEWARE, answered=response))

    def process_exception(self, request, exception):
        # a view that asked Redis itself (usage() for a dashboard) and let the outage through: the app's 503
        # with its Retry-After, never a 500 the app caused
        if isinstance(exception, Unavailable):
            return service_unavailable(request)
        return None


def _known_unmatched(request) -> bool:
    """Whether the middleware found before, under the index in force, that no policy meets the request's route
    (_Routes.nothing_for): most requests of a site, then answered by this lookup alone (no route, no sequence).
    Inside the boundary: when it fails, the request takes the whole sequence."""
    try:
        nothing = _unmatched_route((request.path_info, request.method, getattr(request, "urlconf", None)))
        return nothing is not None and nothing is fresh_index()
    except Exception as error:  # noqa: BLE001 - the boundary (boundary.py)
        faults.record(error, MIDDLEWARE, request)
        return False
