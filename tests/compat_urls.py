"""A URLconf for the compat tests: a DRF view with the compat throttles, views under django-ratelimit's decorator."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpResponse
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.compat.django_ratelimit import ratelimit
from ratelimit_app.compat.drf import AnonRateThrottle, ScopedRateThrottle


class Items(APIView):
    throttle_classes = (AnonRateThrottle, ScopedRateThrottle)
    throttle_scope = "items"

    def get(self, request):
        return Response({"items": []})


@ratelimit(key="ip", rate="2/m")
def contact(request):
    return HttpResponse("sent")


def denied(request, exception):
    return HttpResponse("slow down", status=429)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("items/", Items.as_view(), name="items"),
    path("contact/", contact, name="contact"),
]
