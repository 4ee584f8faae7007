"""PolicyThrottle enforces policies inside DRF, with DRF's authenticated user, counting once."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

IP = "203.0.113.7"


make = partial(make_policy, name="items", action="items", limit=2, strategy="sliding_log")


@pytest.fixture
def api():
    return APIClient(REMOTE_ADDR=IP)


def statuses(api, times, path="/api/items/"):
    return [api.get(path).status_code for _ in range(times)]


def test_throttle_scope_policy_denies_with_429_and_retry_after(api):
    make(limit=2)
    assert statuses(api, 2) == [200, 200]
    denied = api.get("/api/items/")
    assert denied.status_code == 429
    assert 1 <= int(denied.headers["Retry-After"]) <= 60


def test_drf_responses_carry_the_ratelimit_headers(api):
    make(limit=5)
    response = api.get("/api/items/")
    assert response.headers["RateLimit-Policy"] == '"items";q=5;w=60'
    assert response.headers["RateLimit"] == '"items";r=4;t=60'


def test_url_name_and_path_prefix_match_drf_views_too(api):
    make(name="by-name", action="api-items", limit=1)
    make(name="by-prefix", action="/api/", limit=5)
    assert statuses(api, 2) == [200, 429]


def test_token_authenticated_users_are_counted_per_user(api):
    make(key="user", limit=1)
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    assert statuses(api, 2) == [200, 429]
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=bob).key}")
    assert statuses(api, 1) == [200]


def test_user_or_ip_uses_the_token_user_not_the_address(api):
    make(key="user_or_ip", limit=1)
    assert statuses(api, 1) == [200]  # anonymous: counted by address
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=User.objects.create_user('alice')).key}")
    assert statuses(api, 2) == [200, 429]  # the same address, counted as alice from her first request


def test_session_users_are_known_to_the_throttle(api):
    make(key="user", limit=1)
    api.force_login(User.objects.create_user("alice"))
    assert statuses(api, 2) == [200, 429]


def test_middleware_and_throttle_count_a_request_once(api, redis_client):
    make(name="every-request", action="*", limit=10)
    make(name="api-prefix", action="/api/", limit=10)
    make(name="items", action="items", limit=10)
    response = api.get("/api/items/")
    assert response.headers["RateLimit"].count(";r=9;") == 3


def test_throttle_alone_counts_once_per_policy(api, settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitMiddleware" not in m]
    make(limit=3)
    assert statuses(api, 4) == [200, 200, 200, 429]


def test_the_drf_guides_refusal_is_the_body_a_refused_request_gets_with_the_middleware(api):
    guide = (Path(__file__).parent.parent / "docs" / "howto" / "drf.md").read_text()
    shown = re.search(r"^HTTP/1.1 429 Too Many Requests\n.*?\n\n(.*?)\n```", guide, re.M | re.S).group(1)
    make(name="orders-per-user", limit=3, window=60, strategy="fixed_window")  # the guide's policy, on this view
    statuses(api, 3)
    refused = api.get("/api/items/")
    assert refused.status_code == 429

    def waits_as_n(text: str) -> str:
        return re.sub(r"Retry in \d+ s|\"retry_after\": \d+", lambda m: re.sub(r"\d+", "N", m.group()), text)

    assert waits_as_n(refused.content.decode()) == waits_as_n(shown)


def test_a_drf_views_response_bytes_are_counted_once_drf_has_rendered_it(api):
    """DRF hands the throttle's door its Response before rendering it: a content-bytes policy is settled with
    the bytes Django's handler then sends."""
    make(name="items-bytes", limit=100_000, window=60, strategy="fixed_window", unit="content-bytes")
    first = api.get("/api/items/")
    assert first.status_code == 200 and first["RateLimit"].startswith('"items-bytes";r=99999;')  # the estimate, 1
    second = api.get("/api/items/")
    assert second["RateLimit"].startswith(f'"items-bytes";r={100_000 - len(first.content) - 1};')
