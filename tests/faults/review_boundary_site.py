"""The site the hostile review of the boundary attacks (tests/faults/test_review_boundary.py): the compat
drop-ins, DRF, streamed bodies, views that raise, and a key function and a cost that raise."""

from __future__ import annotations

from django.http import HttpResponse, StreamingHttpResponse
from django.urls import include, path
from rest_framework.response import Response
from rest_framework.views import APIView

from project.urls import urlpatterns as demo_patterns
from ratelimit_app.compat import django_ratelimit
from ratelimit_app.compat.drf import AnonRateThrottle
from ratelimit_app.decorators import ratelimit
from ratelimit_app.throttling import PolicyThrottle


class ViewError(Exception):
    """The view's own error: it must reach the site as it is."""


def broken_key(request):
    raise RuntimeError("the key function is broken")


class Unprintable(Exception):
    """An error whose text cannot be made (a class that expects arguments it was not given)."""

    def __str__(self) -> str:
        return self.detail  # never set


def unprintable_key(request):
    raise Unprintable()


def broken_cost(request):
    raise RuntimeError("the cost function is broken")


def broken_denied_view(request, state):
    raise RuntimeError("the denied view is broken")


class Anon(AnonRateThrottle):
    rate = "1000/m"


class CompatDrf(APIView):
    throttle_classes = [Anon]

    def get(self, request):
        return Response({"compat": True})


class PolicyDrf(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "review-drf"

    def get(self, request):
        return Response({"drf": True})


@django_ratelimit.ratelimit(key="ip", rate="1000/m")
def compat_decorated(request):
    return HttpResponse("compat decorated")


def plain(request):
    return HttpResponse("plain")


def streamed(request):
    return StreamingHttpResponse(iter([b"a" * 10, b"b" * 10]))


def raising(request):
    raise ViewError("the view's own")


@ratelimit("review-decorated")
def decorated(request):
    return HttpResponse("decorated")


@ratelimit("review-raising")
def decorated_raising(request):
    raise ViewError("the view's own, decorated")


urlpatterns = [
    path("compat/drf", CompatDrf.as_view()),
    path("compat/decorated", compat_decorated),
    path("drf", PolicyDrf.as_view()),
    path("plain", plain),
    path("streamed", streamed),
    path("raising", raising),
    path("decorated", decorated),
    path("decorated-raising", decorated_raising),
    path("", include(demo_patterns)),
]
