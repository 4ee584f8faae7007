"""Views that declare their policies in code, as a fresh deploy meets them: a global rate, a cost
beside a rate, and views routed twice with a different rate on each route."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import path

from ratelimit_app.decorators import ratelimit


def answer(request):
    return HttpResponse("ok")


@ratelimit(rate="50/5m", key="global")
def limited(request):
    return HttpResponse("ok")


@ratelimit(rate="300/5m", key="global", cost=3)
def costly(request):
    return HttpResponse("ok")


def shared(request):
    return HttpResponse("shared")


def named(request):
    return HttpResponse("named")


urlpatterns = [
    path("limited/", limited, name="limited"),
    path("costly/", costly, name="costly"),
    path("open/", answer, name="open"),
    # one view, two routes, each with the rate written on it
    path("two/", ratelimit(rate="2/m", key="ip")(shared), name="two"),
    path("five/", ratelimit(rate="5/m", key="ip")(shared), name="five"),
    path("named-two/", ratelimit(rate="2/m", key="ip", name="fault-named-two")(named), name="named-two"),
    path("named-five/", ratelimit(rate="5/m", key="ip", name="fault-named-five")(named), name="named-five"),
]
