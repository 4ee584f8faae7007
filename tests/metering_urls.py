"""A URLconf for the tests of metered usage: views that settle what they used, in a whole response, in a
streamed body, through each door; and responses whose bytes a content-bytes policy counts."""

from __future__ import annotations

from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

import ratelimit_app
from ratelimit_app.decorators import ratelimit
from ratelimit_app.throttling import PolicyThrottle

ESTIMATE = 10  # tokens a request is admitted on


def used(request) -> int:
    return int(request.GET.get("used", ESTIMATE))


@ratelimit("llm", cost=ESTIMATE)
def complete(request):
    ratelimit_app.settle(request, tokens=used(request))
    return HttpResponse("done")


@ratelimit("llm", cost=ESTIMATE)
async def acomplete(request):
    await ratelimit_app.asettle(request, tokens=used(request))
    return HttpResponse("done")


@ratelimit("llm", cost=ESTIMATE)
def complete_streamed(request):
    def chunks():
        yield "thinking... "
        ratelimit_app.settle(request, tokens=used(request))  # known as the last chunk is made
        yield "done"
    return StreamingHttpResponse(chunks())


@ratelimit("llm", cost=lambda request: int(request.GET["estimate"]))
def complete_estimated(request):
    ratelimit_app.settle(request, tokens=used(request))
    return HttpResponse("done")


@ratelimit("llm-priced")  # its estimate: the admin's action cost
def complete_priced(request):
    ratelimit_app.settle(request, tokens=used(request))
    return HttpResponse("done")


@ratelimit("llm", cost=ESTIMATE)
async def acomplete_streamed(request):
    async def chunks():
        yield "thinking... "
        await ratelimit_app.asettle(request, tokens=used(request))  # known as the last chunk is made
        yield "done"
    return StreamingHttpResponse(chunks())


@ratelimit("llm", cost=ESTIMATE)
def settled_twice(request):
    ratelimit_app.settle(request, tokens=1)
    ratelimit_app.settle(request, tokens=2)
    return HttpResponse("settled")


@ratelimit("llm", cost=ESTIMATE)
def failing(request):
    ratelimit_app.settle(request, tokens=used(request))
    raise ValueError("the model failed")


@ratelimit("plain")
def plain(request):
    return HttpResponse("done")


def by_hit(request):
    verdict = ratelimit_app.hit(request, "llm", cost=ESTIMATE)
    if not verdict.allowed:
        ratelimit_app.settle(request, tokens=used(request))  # never admitted: ignored
        return HttpResponse("refused", status=429)
    ratelimit_app.settle(request, tokens=used(request))
    return HttpResponse("done")


async def by_ahit(request):
    verdict = await ratelimit_app.ahit(request, "llm", cost=ESTIMATE)
    if not verdict.allowed:
        await ratelimit_app.asettle(request, tokens=used(request))  # never admitted: ignored
        return HttpResponse("refused", status=429)
    await ratelimit_app.asettle(request, tokens=used(request))
    return HttpResponse("done")


class Completion(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "llm"
    throttle_cost = ESTIMATE

    def post(self, request):
        ratelimit_app.settle(request, tokens=int(request.data.get("used", ESTIMATE)))
        return Response({"done": True})


class Chat(APIView):
    """An LLM endpoint: its estimate from the request (the prompt's tokens and the most it may answer)."""

    throttle_classes = [PolicyThrottle]
    throttle_scope = "chat"

    def get_throttle_cost(self, request):
        return 1008

    def post(self, request):
        ratelimit_app.settle(request, tokens=int(request.data["used"]))
        return Response({"done": True})


class DownloadApi(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "download"

    def get(self, request):
        return Response({"data": "x" * int(request.GET["size"])})  # rendered after the throttle's door


def download(request):
    return HttpResponse(b"x" * int(request.GET["size"]))


def download_streamed(request):
    size = int(request.GET["size"])
    return StreamingHttpResponse(("é" for _ in range(size)))  # two bytes each in UTF-8


urlpatterns = [
    path("llm/", complete),
    path("llm/async/", acomplete),
    path("llm/plain/", plain),
    path("llm/streamed/", complete_streamed),
    path("llm/async/streamed/", acomplete_streamed),
    path("llm/estimated/", complete_estimated),
    path("llm/priced/", complete_priced),
    path("llm/ahit/", by_ahit),
    path("llm/twice/", settled_twice),
    path("llm/failing/", failing),
    path("llm/hit/", by_hit),
    path("llm/drf/", Completion.as_view()),
    path("chat/", Chat.as_view()),
    path("download/", download, name="download"),
    path("download/api/", DownloadApi.as_view()),
    path("download/streamed/", download_streamed, name="download"),
]
