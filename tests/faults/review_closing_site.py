"""Views that take in-flight places with hit()/ahit() (policy "held", limit 1, key ip) and end in the
ways a request ends: sleeping while the client leaves, a streamed body that fails, a hit() in a body."""

from __future__ import annotations

import asyncio
import time

from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path

from ratelimit_app import ahit, hit


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


def body_hits(request):
    def chunks():
        yield b"a"
        yield b"counted" if hit(request, "held").allowed else b"refused"
    return StreamingHttpResponse(chunks())


urlpatterns = [
    path("hit/", hitting),
    path("hit-sleep/", hit_then_sleep),
    path("ahit-sleep/", ahit_then_sleep),
    path("hit-stream-fails/", hit_then_failing_stream),
    path("ahit-astream-fails/", ahit_then_failing_astream),
    path("body-hits/", body_hits),
]
