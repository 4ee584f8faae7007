"""URLs of the demo site: the admin, and the demo views that the demo policies protect."""

from django.contrib import admin
from django.urls import include, path

from project.demo import views
from ratelimit_app.metrics import metrics_view

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    path("demo/", include("project.demo.urls")),
    path("api/items/", views.ItemList.as_view(), name="api-items"),
    path("metrics", metrics_view, name="metrics"),  # what Prometheus scrapes; keep it private in production
]
