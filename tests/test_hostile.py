"""Hostile requests: keys stay bounded, the limit still holds, nothing raises."""

from __future__ import annotations

from functools import partial

import pytest
from django.test import Client

from tests.helpers import make_policy

pytestmark = pytest.mark.django_db


make = partial(make_policy, name="search", action="demo:search", limit=2)


def search(client, **extra):
    extra.setdefault("REMOTE_ADDR", "203.0.113.7")
    return client.get("/demo/search/?q=a", **extra).status_code


def assert_keys_bounded(redis_client, forbidden: str):
    for name in redis_client.keys("*"):
        assert len(name) < 80
        assert forbidden.encode("latin-1") not in name
    for name in redis_client.keys("*live*"):
        for member in redis_client.zrange(name, 0, -1):
            assert len(member) < 160 and forbidden.encode("latin-1") not in member


def test_a_10_kb_header_as_key_stays_out_of_redis_and_is_limited(client, redis_client):
    make(key="header:X-Api-Key")
    huge = "k" * 10_240
    assert [search(client, HTTP_X_API_KEY=huge) for _ in range(3)] == [200, 200, 429]
    assert_keys_bounded(redis_client, "k" * 200)


def test_non_utf8_bytes_in_a_header_and_a_parameter(redis_client):
    make(key="ip,header:User-Agent,param:q")
    client = Client()
    odd = "\xff\xfe\x00bot\x80"  # how WSGI hands over undecodable bytes: latin-1 characters
    statuses = [client.get("/demo/search/?q=%ff%fe%80", REMOTE_ADDR="203.0.113.7", HTTP_USER_AGENT=odd).status_code
                for _ in range(3)]  # the query string is not UTF-8 either
    assert statuses == [200, 200, 429]
    assert_keys_bounded(redis_client, "\x00bot")  # shown in the admin (a plain header) but never raw


def test_forged_forwarded_for_from_an_untrusted_client_is_ignored(client, settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.1"]
    make(limit=2)
    statuses = [search(client, HTTP_X_FORWARDED_FOR=f"198.51.100.{i}, 10.0.0.1") for i in range(4)]
    assert statuses == [200, 200, 429, 429]


def test_rotating_ipv6_addresses_inside_one_64_are_one_subject(client):
    make(limit=3)
    statuses = [search(client, REMOTE_ADDR=f"2001:db8:1:2::{i:x}") for i in range(1, 6)]
    assert statuses == [200, 200, 200, 429, 429]
    assert search(client, REMOTE_ADDR="2001:db8:1:3::1") == 200  # another /64


def test_a_key_spec_pointing_at_a_missing_header_does_not_apply(client):
    make(key="header:X-Tenant", limit=1)
    assert [search(client) for _ in range(3)] == [200, 200, 200]


def test_a_garbage_remote_addr_does_not_raise(client):
    make(limit=1)
    assert search(client, REMOTE_ADDR="not-an-ip") == 200


def test_header_subjects_are_masked_on_the_live_page(admin_client, client):
    policy = make(key="header:X-Api-Key", limit=5)
    search(client, HTTP_X_API_KEY="sk_live_0123456789abcdef")
    data = admin_client.get(f"/admin/ratelimit_app/policy/{policy.pk}/live/?format=json").json()
    assert data["subjects"][0]["subject"] == "header:X-Api-Key=…cdef"
    assert "0123456789" not in admin_client.get(f"/admin/ratelimit_app/policy/{policy.pk}/live/").content.decode()
