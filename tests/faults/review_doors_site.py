"""Views for the review of the doors: a decorator under the middleware, nested decorators, computed
costs, streamed bodies, views failing after the decision, slow async views, a DRF view with a cost."""

from __future__ import annotations

import asyncio
import time

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from django_redis import get_redis_connection
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app import ahit, check, hit
from ratelimit_app.decorators import ratelimit


def _cost(request):
    return int(request.GET.get("n", "1"))


@ratelimit("both")
def both(request):
    return HttpResponse("decorated, under the middleware")


@ratelimit("outer")
@ratelimit("inner")
def nested(request):
    return HttpResponse("two decorators")


@ratelimit("outer")
@ratelimit("inner")
async def anested(request):
    await asyncio.sleep(0)
    return HttpResponse("two decorators, async")


@ratelimit("costly", cost=_cost)
def costly(request):
    return HttpResponse("costed")


@ratelimit("costly", cost=_cost)
async def acostly(request):
    return HttpResponse("costed, async")


CHUNKS_MADE = "review:chunks"  # how many chunks the streamed views produced (work a client may never see)


def _chunks(count):
    for n in range(count):
        time.sleep(0.01)
        get_redis_connection("default").incr(CHUNKS_MADE)
        yield b"x" * 65536


async def _achunks(count):
    for n in range(count):
        await asyncio.sleep(0.01)
        get_redis_connection("default").incr(CHUNKS_MADE)
        yield b"x" * 65536


@ratelimit("stream")
def stream(request):
    return StreamingHttpResponse(_chunks(int(request.GET.get("chunks", "200"))))


@ratelimit("stream")
async def astream(request):
    return StreamingHttpResponse(_achunks(int(request.GET.get("chunks", "200"))))


@ratelimit("raise")
def raising(request):
    raise ValueError("the view failed after the decision")


@ratelimit("raise")
async def araising(request):
    raise ValueError("the view failed after the decision")


@ratelimit("asleep")
async def asleep(request):
    await asyncio.sleep(float(request.GET.get("seconds", "0")))
    return HttpResponse("slept")


@ratelimit("asleep")
def sleep(request):
    time.sleep(float(request.GET.get("seconds", "0")))
    return HttpResponse("slept")


def hitting(request):
    return HttpResponse("counted", status=200 if hit(request, "hitter").allowed else 429)


async def ahitting(request):
    return HttpResponse("counted", status=200 if (await ahit(request, "hitter")).allowed else 429)


def look_then_hit(request):
    cost = int(request.GET["n"])
    return JsonResponse({"looked": check(request, "logged", cost).allowed, "hit": hit(request, "logged", cost).allowed})


def plain(request):
    return HttpResponse("plain")


class Priced(APIView):
    throttle_scope = "priced"

    def get_throttle_cost(self, request):
        return int(request.query_params.get("n", "1"))

    def get(self, request):
        return Response({"ok": True})


class Failing(APIView):
    throttle_scope = "drf1"

    def get(self, request):
        raise ValueError("the DRF view failed after the throttle")


class Streamed(APIView):
    throttle_scope = "drf1"

    def get(self, request):
        return StreamingHttpResponse(_chunks(int(request.query_params.get("chunks", "3"))))


urlpatterns = [
    path("both/", both, name="both-url"),
    path("nested/", nested),
    path("anested/", anested),
    path("costly/", costly),
    path("acostly/", acostly),
    path("stream/", stream),
    path("astream/", astream),
    path("raise/", raising),
    path("araise/", araising),
    path("asleep/", asleep),
    path("sleep/", sleep),
    path("hit/", hitting),
    path("ahit/", ahitting),
    path("look-then-hit/", look_then_hit),
    path("plain/", plain, name="plain"),
    path("priced/", Priced.as_view()),
    path("drf-fails/", Failing.as_view()),
    path("drf-stream/", Streamed.as_view()),
]
