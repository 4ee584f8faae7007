"""Views for the in-flight fault scenarios, each under a policy of its own (by URL name or action):
a page with an ETag, a view that fails, a decorated view behind a middleware that fails on its way
out, a slow async view, and a page whose decision may meet a busy Redis."""

from __future__ import annotations

import asyncio

from django.http import HttpResponse
from django.urls import path

from ratelimit_app.decorators import ratelimit


class FailingOnTheWayOut:
    """Raises on the way out of /raise-out/: the response the doors inside returned is dropped unclosed."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith("/raise-out/"):
            raise RuntimeError("a middleware failed on the way out")
        return response


def page(request):
    return HttpResponse("the same page every time")  # ConditionalGetMiddleware gives it an ETag


def fails(request):
    raise ValueError("the view failed")


@ratelimit("raise-out")
def raise_out(request):
    return HttpResponse("answered, then dropped by a middleware")


async def slow(request):
    await asyncio.sleep(float(request.GET.get("seconds", "0")))
    return HttpResponse("done")


urlpatterns = [
    path("page/", page, name="etag"),
    path("fails/", fails, name="fails"),
    path("raise-out/", raise_out),
    path("slow/", slow, name="slow"),
]
