"""A URLconf of DRF views whose throttle_cost cannot be used, for the checks and the doors."""

from __future__ import annotations

from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.throttling import PolicyThrottle


class Priced(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "search"

    def get(self, request):
        return Response({"ok": True})


class Half(Priced):
    throttle_cost = 2.5


class Free(Priced):
    throttle_cost = 0


class Text(Priced):
    throttle_cost = "x"


class Fine(Priced):
    throttle_scope = "fine"
    throttle_cost = 2


urlpatterns = [
    path("half/", Half.as_view(), name="half"),
    path("free/", Free.as_view(), name="free"),
    path("text/", Text.as_view(), name="text"),
    path("fine/", Fine.as_view(), name="fine"),
]
