"""A URLconf for the tests of policies declared in code: views that declare their own policies."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpResponse
from django.urls import path
from django.views import View

from ratelimit_app.decorators import ratelimit


@ratelimit(rate="2/m", key="ip")
def login(request):
    return HttpResponse("ok")


@ratelimit(rate="10/m", key="ip", method="POST", name="comments-per-ip", mode="shadow")
def comment(request):
    return HttpResponse("ok")


@ratelimit(rate="1/h", key="ip", method="POST", strategy="fixed_window")
class Signup(View):
    def get(self, request):
        return HttpResponse("form")

    def post(self, request):
        return HttpResponse("welcome")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", login, name="login"),
    path("comment/", comment, name="comment"),
    path("signup/", Signup.as_view(), name="signup"),
    path("open/", lambda request: HttpResponse("open"), name="open"),
]
