from django.urls import path

from . import views

app_name = "demo"

urlpatterns = [
    path("search/", views.search, name="search"),
    path("login/", views.login, name="login"),
    path("quote/", views.quote, name="quote"),
    path("quote/class/", views.QuoteView.as_view(), name="quote-class"),
    path("report/", views.report, name="report"),
]
