"""A URLconf whose one regex route is not anchored: it matches a path anywhere, so no prefix is unrouted."""

from __future__ import annotations

from django.urls import re_path

from tests.routed_urls import page

urlpatterns = [re_path(r"feeds/", page, name="feeds")]
