"""Subjects written as a person would (ip:203.0.113.7, user:alice, header:X-Api-Key=...): the same
subject the request path counts, and the live page's reset accepts them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory
from django.urls import reverse

from ratelimit_app.subjects import SubjectTextError, parse_key_spec, subject_for, subject_from_text
from tests.helpers import make_policy

IP = "203.0.113.7"


def request(ip=IP, user=None, **meta):
    made = RequestFactory().get("/?q=term-1", REMOTE_ADDR=ip, **meta)
    made.user = user or AnonymousUser()
    return made


@pytest.mark.parametrize(
    "spec, text, made",
    [
        ("ip", "ip:203.0.113.7", request()),
        ("ip", " IP:203.0.113.7 ", request()),
        ("ip", "ip:2001:db8::1", request("2001:db8::7")),  # grouped by /64, as the request path groups it
        ("ip", "ip:2001:db8::/64", request("2001:db8::7")),  # as the live page shows it
        ("header:X-Api-Key", "header:X-Api-Key=secret-123", request(HTTP_X_API_KEY="secret-123")),
        ("header:X-Api-Key", "header:x-api-key=secret-123", request(HTTP_X_API_KEY="secret-123")),
        ("param:q", "param:q=term-1", request()),
        ("global", "global", request()),
        ("ip,header:User-Agent", "ip:203.0.113.7, header:User-Agent=Mozilla/5.0 (X11, Linux)",
         request(HTTP_USER_AGENT="Mozilla/5.0 (X11, Linux)")),
        ("user_or_ip", "ip:203.0.113.7", request()),
    ],
)
def test_written_subject_is_the_subject_the_request_path_counts(spec, text, made):
    key_spec = parse_key_spec(spec)
    assert subject_from_text(key_spec, text) == subject_for(key_spec, made)


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["user:alice", "user:{pk}"])
def test_users_are_written_by_id_or_username(text):
    alice = User.objects.create_user("alice")
    for spec in ("user", "user_or_ip"):
        key_spec = parse_key_spec(spec)
        assert subject_from_text(key_spec, text.format(pk=alice.pk)) == subject_for(key_spec, request(user=alice))


@pytest.mark.django_db
def test_a_deleted_users_id_still_names_its_subject():
    assert subject_from_text(parse_key_spec("user"), "user:999").display == "user:999"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "spec, text, message",
    [
        ("ip", "user:42", "is not a subject of the key 'ip': write it as ip:203.0.113.7"),
        ("ip", "ip:not-an-address", "is not an IP address"),
        ("ip", "ip:", "has no value"),
        ("user", "user:nobody", "No user has the id or the username 'nobody'"),
        ("header:X-Api-Key", "header:X-Other=1", "write it as header:x-api-key=<value>"),
        ("global", "global:x", "takes no value"),
        ("ip,header:User-Agent", "ip:203.0.113.7", "does not have the 2 parts"),
    ],
)
def test_a_subject_that_does_not_fit_the_key_says_why(spec, text, message):
    with pytest.raises(SubjectTextError, match=message):
        subject_from_text(parse_key_spec(spec), text)


# --- the live page's reset ---------------------------------------------------------------------


def reset_url(policy):
    return reverse("admin:ratelimit_app_policy_reset", args=[policy.pk])


def search(client, ip=IP, times=1, **extra):
    return [client.get("/demo/search/?q=a", REMOTE_ADDR=ip, **extra).status_code for _ in range(times)]


@pytest.mark.django_db
def test_live_page_reset_accepts_the_address_as_a_person_writes_it(admin_client, client):
    policy = make_policy(name="search-per-ip", action="demo:search", limit=2, window=3600, key="ip")
    search(client, IP, 2)
    search(client, "198.51.100.9", 2)
    response = admin_client.post(reset_url(policy), {"subject": f"ip:{IP}"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == [f"Counts of subject ip:{IP} reset for search-per-ip."]
    assert search(client, IP) == [200]
    assert search(client, "198.51.100.9") == [429]


@pytest.mark.django_db
def test_live_page_reset_accepts_a_username(admin_client, client):
    policy = make_policy(name="search-per-user", action="demo:search", limit=1, window=3600, key="user")
    alice = User.objects.create_user("alice")
    client.force_login(alice)
    assert search(client, times=2) == [200, 429]
    admin_client.post(reset_url(policy), {"subject": "user:alice"})
    assert search(client) == [200]


@pytest.mark.django_db
def test_live_page_reset_of_a_subject_that_does_not_fit_changes_nothing(admin_client, client):
    policy = make_policy(name="search-per-ip", action="demo:search", limit=1, window=3600, key="ip")
    search(client)
    response = admin_client.post(reset_url(policy), {"subject": "user:alice"}, follow=True)
    assert "Nothing was reset: 'user:alice' is not a subject of the key 'ip'" in [str(m) for m in response.context["messages"]][0]
    assert search(client) == [429]
