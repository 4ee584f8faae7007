"""RateLimitMiddleware: every request, by URL name, path prefix, '*' and method (the sequence: doors.py).
Sync and async: on an ASGI stack it runs without a thread hop, through the asyncio Redis client."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from .boundary import MIDDLEWARE
from .doors import around_view
from .drivers import Io, arun
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
        view = _made(Io, (self.get_response, self.get_response, (request,), _NO_KWARGS))
        if self.is_async:
            return arun(around_view(request, view, MIDDLEWARE, routed=True))
        return around_view.sync(request, view, MIDDLEWARE, routed=True)

    def process_exception(self, request, exception):
        # a view that asked Redis itself (usage() for a dashboard) and let the outage through: the app's 503
        # with its Retry-After, never a 500 the app caused
        if isinstance(exception, Unavailable):
            return service_unavailable(request)
        return None
