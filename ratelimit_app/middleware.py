"""RateLimitMiddleware: every request, by URL name, path prefix, '*' and method. Place it after
AuthenticationMiddleware so `user` policies see the user. What it decides itself: see doors.py."""

from __future__ import annotations

from .doors import middleware_request, middleware_response


class RateLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        refused = middleware_request(request)
        if refused is not None:
            return refused
        return middleware_response(request, self.get_response(request))
