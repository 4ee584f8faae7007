"""usage() for a customer's dashboard: a caller sees only their own usage (subjects that name them, never one
the request merely writes)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory

import ratelimit_app
from tests.helpers import make_policy

KEY = "sk_live_0123456789abcdef"


def _request(ip="203.0.113.9", user=None, path="/api/search", **headers):
    made = RequestFactory().get(path, REMOTE_ADDR=ip, **headers)
    made.user = user or AnonymousUser()
    return made


def _shown(answer) -> dict[str, tuple[int, int, int]]:
    assert answer.status_code == 200
    return {item["policy"]: (item["used"], item["limit"], item["remaining"]) for item in answer.json()["limits"]}


# --- whose usage a caller sees ------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls("tests.usage_urls")
def test_an_anonymous_caller_naming_alice_in_the_query_does_not_see_alices_login_attempts(client):
    make_policy(name="login", action="/accounts/login/", methods="POST", limit=5, window=300, key="param:username")
    make_policy(name="api-per-ip", action="api:search", limit=60, window=60, key="ip")
    for _ in range(4):  # someone tried alice's password four times
        client.post("/accounts/login/", {"username": "alice", "password": "guess"}, REMOTE_ADDR="198.51.100.4")
    shown = _shown(client.get("/api/usage/?username=alice", REMOTE_ADDR="203.0.113.9"))
    assert "login" not in shown  # was (4, 5, 1): alice's attempts, and how many are left to guess with
    assert shown == {"api-per-ip": (0, 60, 60)}  # what the caller's own address used


@pytest.mark.django_db
@pytest.mark.urls("tests.usage_urls")
def test_a_caller_sees_the_usage_counted_per_their_user_address_api_key_or_a_key_function_that_names_them(client):
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    own = {
        "per-user": "user", "per-user-or-ip": "user_or_ip", "per-ip": "ip", "per-key": "header:X-Api-Key",
        "per-ip-and-key": "ip,header:X-Api-Key", "per-account": "tests.usage_urls.account_of",
    }
    others = {  # everybody's count, a value anyone may write, or a function that does not say it names the caller
        "everyone": "global", "per-agent": "header:User-Agent", "per-name": "param:username",
        "per-ip-and-name": "ip,param:username", "per-team": "tests.usage_urls.team_named",
    }
    for name, key in {**own, **others}.items():
        make_policy(name=name, action="api:search", limit=100, window=3600, key=key)
    month = make_policy(name="api-month", action="api:search", strategy="calendar_quota", period="month",
                        time_zone="UTC", limit=1000, window=1, key="header:X-Api-Key")
    headers = {"HTTP_X_API_KEY": KEY, "HTTP_USER_AGENT": "curl/8.5"}
    for _ in range(3):
        assert ratelimit_app.hit(_request(user=alice, path="/api/search?username=alice&team=red", **headers),
                                 "api:search").allowed

    client.force_login(alice)
    shown = _shown(client.get("/api/usage/?username=alice&team=red", REMOTE_ADDR="203.0.113.9", **headers))
    assert shown == {**{name: (3, 100, 97) for name in own}, month.name: (3, 1000, 997)}
    client.force_login(bob)  # another customer, from another address, with another key: none of alice's counts
    shown = _shown(client.get("/api/usage/?username=alice&team=red", REMOTE_ADDR="198.51.100.4",
                              HTTP_X_API_KEY="sk_live_other000000000", HTTP_USER_AGENT="curl/8.5"))
    assert shown == {**{name: (0, 100, 100) for name in own}, month.name: (0, 1000, 1000)}


def test_an_anonymous_caller_without_a_key_sees_the_limits_of_their_address_only(db):
    make_policy(name="per-user", action="api:search", limit=10, window=60, key="user")
    make_policy(name="per-key", action="api:search", limit=10, window=60, key="header:X-Api-Key")
    make_policy(name="per-user-or-ip", action="api:search", limit=10, window=60, key="user_or_ip")
    assert [item.policy for item in ratelimit_app.usage(_request())] == ["per-user-or-ip"]
