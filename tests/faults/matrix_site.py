"""The fault matrix's site: each door of the limiter in front of a trivial view, sync and async
(tests/faults/test_boundary.py). A view that calls hit(), check() or usage() answers the limiter's
Unavailable with 503, as the API reference tells a site without the middleware to."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.urls import include, path
from rest_framework.response import Response
from rest_framework.views import APIView

import ratelimit_app
from ratelimit_app.decorators import ratelimit
from ratelimit_app.throttling import PolicyThrottle
from project.urls import urlpatterns as demo_patterns

# set by a test: called inside the view, after the limiter decided (e.g. stops the Redis server)
during_view: list = []


def _during() -> None:
    for step in during_view:
        step()


def _unavailable(error: Exception) -> HttpResponse:
    return HttpResponse(f"unavailable: {error}", status=503)


def plain(request):
    _during()
    return HttpResponse("plain")


async def aplain(request):
    _during()
    return HttpResponse("plain, async")


@ratelimit("door-decorator")
def decorated(request):
    _during()
    return HttpResponse("decorated")


@ratelimit("door-decorator")
async def adecorated(request):
    _during()
    return HttpResponse("decorated, async")


class Throttled(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "door-drf"

    def get(self, request):
        _during()
        return Response({"drf": True})


def hitting(request):
    try:
        verdict = ratelimit_app.hit(request, "door-hit")
    except ratelimit_app.Unavailable as error:
        return _unavailable(error)
    _during()
    return HttpResponse("hit", status=200 if verdict.allowed else 429)


async def ahitting(request):
    try:
        verdict = await ratelimit_app.ahit(request, "door-hit")
    except ratelimit_app.Unavailable as error:
        return _unavailable(error)
    _during()
    return HttpResponse("hit, async", status=200 if verdict.allowed else 429)


def checking(request):
    try:
        verdict = ratelimit_app.check(request, "door-check")
    except ratelimit_app.Unavailable as error:
        return _unavailable(error)
    _during()
    return HttpResponse("check", status=200 if verdict.allowed else 429)


async def achecking(request):
    try:
        verdict = await ratelimit_app.acheck(request, "door-check")
    except ratelimit_app.Unavailable as error:
        return _unavailable(error)
    _during()
    return HttpResponse("check, async", status=200 if verdict.allowed else 429)


def using(request):
    try:
        found = ratelimit_app.usage(request)
    except ratelimit_app.Unavailable as error:
        return _unavailable(error)
    _during()
    return JsonResponse({"limits": [item.as_dict() for item in found]})


async def ausing(request):
    try:
        found = await ratelimit_app.ausage(request)
    except ratelimit_app.Unavailable as error:
        return _unavailable(error)
    _during()
    return JsonResponse({"limits": [item.as_dict() for item in found]})


urlpatterns = [
    path("door/middleware/sync", plain),
    path("door/middleware/async", aplain),
    path("door/decorator/sync", decorated),
    path("door/decorator/async", adecorated),
    path("door/drf/sync", Throttled.as_view()),
    path("door/drf/async", Throttled.as_view()),
    path("door/hit/sync", hitting),
    path("door/hit/async", ahitting),
    path("door/check/sync", checking),
    path("door/check/async", achecking),
    path("door/usage/sync", using),
    path("door/usage/async", ausing),
    path("", include(demo_patterns)),  # the admin, for the live page
]
