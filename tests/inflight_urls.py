"""A URLconf for the tests of in-flight (concurrency) policies: views that report the places held
while they run, raise, stream, or are reached through each door."""

from __future__ import annotations

from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

import ratelimit_app
from ratelimit_app.decorators import ratelimit
from ratelimit_app.throttling import PolicyThrottle


def in_flight(request, action: str = "inflight") -> str:
    """The places the policies of `action` hold for this request's subject, this request's included."""
    return str(ratelimit_app.check(request, action).decisions[0].count)


def plain(request):
    return HttpResponse(in_flight(request))


def boom(request):
    raise ValueError("the view failed")


def stream(request):
    def chunks():
        yield "first "
        yield in_flight(request)  # still held while the body streams
    return StreamingHttpResponse(chunks())


def stream_with_etag(request):
    response = StreamingHttpResponse(iter(["a body ", "in parts"]))
    response["ETag"] = '"parts"'  # ConditionalGetMiddleware answers If-None-Match with a 304 instead
    return response


@ratelimit("inflight")
def decorated(request):
    return HttpResponse(in_flight(request))


@ratelimit("inflight")
def decorated_boom(request):
    raise ValueError("the view failed")


def by_hit(request):
    verdict = ratelimit_app.hit(request, "inflight")
    return HttpResponse(in_flight(request) if verdict.allowed else "refused", status=200 if verdict.allowed else 429)


def by_hit_boom(request):
    ratelimit_app.hit(request, "inflight")
    raise ValueError("the view failed")


async def by_ahit(request):
    verdict = await ratelimit_app.ahit(request, "inflight")
    return HttpResponse("counted" if verdict.allowed else "refused", status=200 if verdict.allowed else 429)


@ratelimit("inflight")
async def decorated_async(request):
    return HttpResponse(in_flight(request))


class Api(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "inflight"

    def get(self, request):
        return Response({"in_flight": int(in_flight(request))})


class ApiBoom(Api):
    def get(self, request):
        raise ValueError("the view failed")


urlpatterns = [
    path("plain/", plain, name="inflight"),
    path("boom/", boom, name="inflight"),
    path("stream/", stream, name="inflight"),
    path("stream/etag/", stream_with_etag, name="inflight"),
    path("decorated/", decorated),
    path("decorated/boom/", decorated_boom),
    path("decorated/async/", decorated_async),
    path("hit/", by_hit),
    path("hit/async/", by_ahit),
    path("hit/boom/", by_hit_boom),
    path("api/", Api.as_view()),
    path("api/boom/", ApiBoom.as_view()),
]
