"""URLs of the demo site: the admin, and the demo views that the demo policies protect."""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
