"""The kinds of view the demo policies protect: a plain Django view (middleware), a DRF view
(throttle_scope 'items'), a decorated login-like view, async views (function and class), and a slow
async report whose requests in flight are limited."""

from __future__ import annotations

import asyncio
import math

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import View
from django.views.decorators.http import require_http_methods
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.decorators import ratelimit

FRUITS = ["apple", "apricot", "banana", "blackberry", "cherry", "grape", "lemon", "mango", "orange", "pear", "plum"]


def home(request):
    return render(request, "demo/home.html")


def search(request):
    """Protected by the middleware through its URL name, demo:search."""
    query = request.GET.get("q", "").lower()
    return JsonResponse({"query": query, "results": [fruit for fruit in FRUITS if query in fruit]})


class ItemList(APIView):
    """Protected by PolicyThrottle through its throttle_scope."""

    throttle_scope = "items"

    def get(self, request):
        return Response({"user": request.user.get_username() or None, "items": FRUITS[:5]})


@require_http_methods(["GET", "POST"])
@ratelimit("login")
def login(request):
    """A login-like form: every attempt fails, and the 'login' policies limit attempts."""
    if request.method == "POST":
        return HttpResponse("Wrong username or password.\n", status=401, content_type="text/plain")
    return render(request, "demo/login.html")


@ratelimit("quote")
async def quote(request):
    """An async view under @ratelimit: decided through the asyncio Redis client, no thread hop."""
    return JsonResponse({"quote": "Slow is smooth, and smooth is fast."})


@ratelimit("report")
async def report(request):
    """A slow async view (`?seconds=`, at most 30): the 'report' policies count the reports in progress."""
    try:
        seconds = float(request.GET.get("seconds", "2"))
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        return JsonResponse({"detail": "seconds must be a number, e.g. ?seconds=2"}, status=400)
    seconds = min(max(seconds, 0.0), 30.0)
    await asyncio.sleep(seconds)
    return JsonResponse({"report": "ready", "seconds": seconds})


@ratelimit("quote")
class QuoteView(View):
    """The same, as an async class-based view."""

    async def get(self, request):
        return JsonResponse({"quote": "Make haste slowly."})
