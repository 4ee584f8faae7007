"""A URLconf for the check of policies whose action nothing routes (W012): a namespace, a DRF view with a
throttle_scope, a view of @ratelimit, an unnamed view, and regex routes."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import include, path, re_path
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app import ratelimit
from ratelimit_app.throttling import PolicyThrottle


def page(request, **kwargs):
    return HttpResponse("ok")


@ratelimit("login-attempts")
def login(request):
    return HttpResponse("ok")


class Search(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "searches"

    def get(self, request):
        return Response({"ok": True})


api = ([path("search/", Search.as_view(), name="search"), path("items/<int:pk>/", page, name="item")], "api")

urlpatterns = [
    path("api/v1/", include(api)),
    path("login/", login, name="login"),
    path("about/", page),
    re_path(r"^files/(?P<name>.+)$", page, name="file"),
    re_path(r"^reports?/$", page, name="reports"),
]
