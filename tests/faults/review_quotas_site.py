"""Views for the review of calendar quotas: a counted view, and the customer's usage view of the docs."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.urls import path

import ratelimit_app


def counted(request):
    return HttpResponse("counted by the quotas of its path")


def api_usage(request):  # as the how-to "Selling an API" writes it
    return JsonResponse({"limits": [item.as_dict() for item in ratelimit_app.usage(request)]})


urlpatterns = [
    path("month/", counted),
    path("day/", counted),
    path("usage/", api_usage),
]
