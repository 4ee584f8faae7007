"""URLs of the end-to-end run: one trivial view, plain, behind django-ratelimit's decorator, and as a
DRF view with no throttle, with DRF's UserRateThrottle and with our PolicyThrottle."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import path
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import APIView

from ratelimit_app.throttling import PolicyThrottle


def trivial(request):
    return HttpResponse("ok", content_type="text/plain")


class Trivial(APIView):
    throttle_classes: list = []

    def get(self, request):
        return trivial(request)


class UserThrottled(Trivial):
    throttle_classes = [UserRateThrottle]


class PolicyThrottled(Trivial):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "bench-drf"


urlpatterns = [
    # served with RateLimitMiddleware: p0 is matched by no policy, p1 by one, p3 by three
    path("p0/", trivial, name="p0"),
    path("p1/", trivial, name="p1"),
    path("p3/", trivial, name="p3"),
    # served without it
    path("plain/", trivial, name="plain"),
    path("drf/", Trivial.as_view(), name="drf"),
    path("drf-user-throttle/", UserThrottled.as_view(), name="drf-user-throttle"),
    path("drf-policy-throttle/", PolicyThrottled.as_view(), name="drf-policy-throttle"),
]

try:
    from django_ratelimit.decorators import ratelimit
except ImportError:  # a peer of the bench only (bench/requirements.txt): its row is left out
    pass
else:
    urlpatterns.append(
        path("django-ratelimit/", ratelimit(key="ip", rate="1000000000/h", block=True)(trivial), name="django-ratelimit")
    )
