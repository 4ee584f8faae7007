"""Views that take in-flight places with hit()/ahit() (policy "held", limit 1, key ip) and end in the
ways a request ends: sleeping while the client leaves, a streamed body that fails, a 304, DRF."""

from __future__ import annotations

import asyncio
import time

from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app import ahit, hit
from ratelimit_app.throttling import PolicyThrottle


def _answer(verdict) -> HttpResponse:
    return HttpResponse("counted" if verdict.allowed else "refused", status=200 if verdict.allowed else 429)


def hitting(request):
    return _answer(hit(request, "held"))


def hit_then_sleep(request):
    verdict = hit(request, "held")
    time.sleep(float(request.GET.get("seconds", "3")))
    return _answer(verdict)


async def ahit_then_sleep(request):
    verdict = await ahit(request, "held")
    await asyncio.sleep(float(request.GET.get("seconds", "3")))
    return _answer(verdict)


def _failing_chunks():
    yield b"x" * 100
    raise ValueError("the body failed while it was produced")


async def _afailing_chunks():
    yield b"x" * 100
    raise ValueError("the body failed while it was produced")


def hit_then_failing_stream(request):
    if not hit(request, "held").allowed:
        return HttpResponse("refused", status=429)
    return StreamingHttpResponse(_failing_chunks())


async def ahit_then_failing_astream(request):
    if not (await ahit(request, "held")).allowed:
        return HttpResponse("refused", status=429)
    return StreamingHttpResponse(_afailing_chunks())


def _chunks():
    yield b"a"
    yield b"b"


async def _achunks():
    yield b"a"
    yield b"b"


def hit_then_stream(request):
    if not hit(request, "held").allowed:
        return HttpResponse("refused", status=429)
    return StreamingHttpResponse(_chunks())


async def ahit_then_astream(request):
    if not (await ahit(request, "held")).allowed:
        return HttpResponse("refused", status=429)
    return StreamingHttpResponse(_achunks())


def body_hits(request):
    def chunks():
        yield b"a"
        yield b"counted" if hit(request, "held").allowed else b"refused"
    return StreamingHttpResponse(chunks())


def hit_then_raise(request):
    hit(request, "held")
    raise ValueError("the view failed after hit()")


def hit_with_etag(request):
    response = _answer(hit(request, "held"))
    response["ETag"] = '"same"'
    return response


def hit_twice(request):
    first, second = hit(request, "held"), hit(request, "other")
    return _answer(first) if not first.allowed else _answer(second)


class BrokenClose(HttpResponse):
    def close(self):
        raise OSError("a response whose close fails")


def hit_close_raises(request):
    verdict = hit(request, "held")
    response = BrokenClose("counted" if verdict.allowed else "refused", status=200 if verdict.allowed else 429)
    return response


class DrfHit(APIView):
    throttle_classes = []

    def get(self, request):
        return Response({"allowed": hit(request, "held").allowed})


class DrfThrottledHit(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "drf"

    def get(self, request):
        return Response({"allowed": hit(request, "held").allowed})


urlpatterns = [
    path("hit/", hitting),
    path("hit-sleep/", hit_then_sleep),
    path("ahit-sleep/", ahit_then_sleep),
    path("hit-stream-fails/", hit_then_failing_stream),
    path("ahit-astream-fails/", ahit_then_failing_astream),
    path("hit-stream/", hit_then_stream),
    path("ahit-astream/", ahit_then_astream),
    path("hit-raise/", hit_then_raise),
    path("body-hits/", body_hits),
    path("hit-etag/", hit_with_etag),
    path("hit-twice/", hit_twice),
    path("hit-close-raises/", hit_close_raises),
    path("drf-hit/", DrfHit.as_view()),
    path("drf-throttled-hit/", DrfThrottledHit.as_view()),
]
