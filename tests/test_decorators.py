"""@ratelimit(action) on function views and class-based views, and the programmatic API."""

from __future__ import annotations

import contextvars
from functools import partial

import pytest
from django.contrib.auth.models import AnonymousUser
from django.http import HttpResponse
from django.test import RequestFactory
from django.views import View

import ratelimit_app
from ratelimit_app.decorators import ratelimit
from tests.helpers import closed, count_round_trips, make_policy

pytestmark = pytest.mark.django_db


make = partial(make_policy, name="login-per-ip", action="login", limit=2, window=300)


def request(method="post", ip="203.0.113.7"):
    made = getattr(RequestFactory(), method)("/somewhere/", REMOTE_ADDR=ip)
    made.user = AnonymousUser()
    return made


@ratelimit("login")
def function_view(request):
    return HttpResponse("ok")


@ratelimit("login")
class ClassView(View):
    def post(self, request):
        return HttpResponse("ok")


def test_decorated_function_view_is_limited_by_its_action():
    make()
    assert [function_view(request()).status_code for _ in range(3)] == [200, 200, 429]


def test_decorated_function_view_counts_each_client_address_apart():
    make(limit=1)
    clients = ("203.0.113.7", "203.0.113.8", "203.0.113.7", "203.0.113.8")
    assert [function_view(request(ip=ip)).status_code for ip in clients] == [200, 200, 429, 429]


def test_decorated_function_view_counts_each_client_behind_a_trusted_proxy_apart(settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.1"]
    make(limit=1)

    def through_the_proxy(client: str):
        made = request(ip="10.0.0.1")
        made.META["HTTP_X_FORWARDED_FOR"] = client
        return function_view(made).status_code

    assert [through_the_proxy(ip) for ip in ("198.51.100.1", "198.51.100.2", "198.51.100.1")] == [200, 200, 429]


def test_a_policy_written_after_a_decorated_views_requests_limits_its_next_ones():
    assert [function_view(request()).status_code for _ in range(3)] == [200, 200, 200]  # no policy yet
    make(limit=1)
    assert [function_view(request()).status_code for _ in range(2)] == [200, 429]


def test_decorated_view_responses_carry_headers():
    make()
    assert function_view(request())["RateLimit"].startswith('"login-per-ip";r=1;t=')


def test_decorated_class_based_view_is_limited():
    make()
    view = ClassView.as_view()
    assert [view(request()).status_code for _ in range(3)] == [200, 200, 429]


def test_the_demo_login_view_is_limited_on_post_only(client):
    make(methods="POST", limit=1)
    assert [client.get("/demo/login/").status_code for _ in range(3)] == [200, 200, 200]
    assert [client.post("/demo/login/").status_code for _ in range(2)] == [401, 429]


def test_check_tells_without_counting_and_hit_counts():
    make(limit=1)
    assert ratelimit_app.check(request(), "login").allowed
    assert ratelimit_app.check(request(), "login").allowed
    assert ratelimit_app.hit(request(), "login").allowed
    assert not ratelimit_app.hit(request(), "login").allowed
    verdict = ratelimit_app.check(request(), "login")
    assert not verdict.allowed and verdict.decisions[0].count == 1


def test_an_action_without_policies_is_always_allowed_and_costs_nothing():
    make()
    ratelimit_app.hit(request(), "no-such-action")  # loads the policy index (reads the version once)
    with count_round_trips() as trips:
        assert ratelimit_app.hit(request(), "no-such-action").allowed
    assert trips[0] == 0


def test_the_decorator_is_exported_by_the_package_too():
    import ratelimit_app
    from ratelimit_app import ratelimit as exported
    from ratelimit_app.decorators import ratelimit as decorator

    assert exported is decorator
    with pytest.raises(AttributeError):
        ratelimit_app.no_such_name  # noqa: B018


def test_a_drf_view_declares_its_policy_in_tokens_with_the_decorator_on_its_class():
    """DRF views need no attribute of their own for a unit: the unit is the policy's, and @ratelimit on the
    APIView class declares one; the view settles with DRF's request."""
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from ratelimit_app.models import Policy

    @ratelimit(rate="1000/m", key="ip", unit="tokens", cost=300, name="drf-chat-tokens")
    class Chat(APIView):
        def post(self, request):
            ratelimit_app.settle(request, tokens=int(request.data["used"]))
            return Response({"ok": True})

    view = Chat.as_view()
    answers = [view(RequestFactory().post("/chat/", {"used": 50}, REMOTE_ADDR="203.0.113.7")) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 200]  # 50 a chat: four fit, not three
    assert answers[0]["RateLimit-Policy"] == '"drf-chat-tokens";q=1000;w=60'
    assert answers[3]["RateLimit"].startswith('"drf-chat-tokens";r=550;')  # 3 x 50 settled, 300 estimated
    assert Policy.objects.get(name="drf-chat-tokens").unit == "tokens"


def test_a_response_rendered_after_the_door_is_counted_in_the_bytes_it_sent(caplog):
    from django.template import engines
    from django.template.response import TemplateResponse

    make_policy(name="page-bytes", action="pages", limit=10_000, window=60, unit="content-bytes")

    @ratelimit("pages", cost=100)
    def page(request):  # rendered by Django's handler after the decorator has returned
        return TemplateResponse(request, engines["django"].from_string("x" * 10), {})

    # two requests in flight, each in its own context as a server serves them (what each holds is its context's)
    served = [contextvars.copy_context() for _ in range(2)]
    answers = [context.run(page, request("get")) for context in served]
    assert answers[1]["RateLimit"].startswith('"page-bytes";r=9800;')  # two estimates of 100 taken
    assert [answer.render().content for answer in answers] == [b"x" * 10] * 2
    for context, answer in zip(served, answers):
        context.run(closed, answer)  # as the server does once it sent the answer: each settles at the 10 bytes sent
    assert page(request("get"))["RateLimit"].startswith('"page-bytes";r=9880;')
    assert "the limiter failed" not in caplog.text
