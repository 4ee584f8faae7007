"""Throttle classes for the compat tests, in their own module: a class with its own rate declares its
policy when it is defined, so it is imported by the tests that use it, not when tests are collected."""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.compat.drf import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle


class Burst(UserRateThrottle):
    rate = "2/m"
    scope = "burst"


class PerApiKey(SimpleRateThrottle):
    """A subclass with its own cache key: one count per API key header."""

    rate = "1/m"

    def get_cache_key(self, request, view):
        key = request.META.get("HTTP_X_API_KEY")
        return None if key is None else self.cache_format % {"scope": "apikey", "ident": key}


class TwoThrottles(APIView):
    throttle_classes = (Burst, PerApiKey)

    def get(self, request):
        return Response("ok")


class Hundred(AnonRateThrottle):
    rate = "100/h"
