"""A URLconf for the tests of usage(): a login form counted per username, and the customer's usage view as the
how-to "Selling an API" writes it; with two key functions, one that says it names the caller and one that does not."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.urls import path

import ratelimit_app


def login(request):
    return HttpResponse("wrong password", status=200)


def api_usage(request):
    return JsonResponse({"limits": [item.as_dict() for item in ratelimit_app.usage(request)]})


def account_of(request) -> str | None:
    """The caller's account, from their session's user: a value they cannot choose."""
    return f"account-{request.user.pk}" if request.user.is_authenticated else None


account_of.identifies_caller = True


def team_named(request) -> str | None:
    """A team named by the request: anyone can write any team."""
    return request.GET.get("team")


urlpatterns = [
    path("accounts/login/", login),
    path("api/usage/", api_usage),
]
