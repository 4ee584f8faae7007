"""Hostile requests: keys stay bounded, the limit still holds, nothing raises."""

from __future__ import annotations

import gc
import logging
import tracemalloc
import urllib.parse
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


# --- param: the value the view reads --------------------------------------------------------------

login_policy = partial(make_policy, name="login-per-username", action="login", limit=2, window=300, key="param:username")
FORM = "application/x-www-form-urlencoded"


def login(client, body, content_type=FORM, query=""):
    return client.post(f"/demo/login/{query}", body, content_type=content_type, REMOTE_ADDR="203.0.113.7").status_code


def test_a_query_string_decoy_does_not_walk_around_a_body_parameter(client):
    login_policy()
    statuses = [login(client, "username=bob&password=x", query=f"?username=decoy{i}") for i in range(3)]
    assert statuses == [401, 401, 429]


@pytest.mark.parametrize("content_type", ["Application/X-WWW-Form-Urlencoded", " application/x-www-form-urlencoded",
                                          "application/x-www-form-urlencoded; charset=utf-8"])
def test_form_content_types_are_compared_as_django_does(client, content_type):
    login_policy()
    assert [login(client, "username=bob", content_type) for _ in range(3)] == [401, 401, 429]


def test_a_json_body_is_limited_by_its_top_level_field(client):
    login_policy()
    statuses = [login(client, {"username": "bob", "password": f"guess{i}"}, "application/json") for i in range(3)]
    assert statuses == [401, 401, 429]


def test_a_multipart_body_is_limited(client):
    login_policy()
    statuses = [client.post("/demo/login/", {"username": "bob", "password": f"guess{i}"}).status_code for i in range(3)]
    assert statuses == [401, 401, 429]


@pytest.mark.parametrize("body, content_type", [
    ("--nope\r\nbroken", "multipart/form-data; boundary=xyz"),
    ('{"username": ', "application/json"),
    ("[1, 2]", "application/json"),
    ("username=%ff%fe", "application/x-www-form-urlencoded; charset=latin-1"),
])
def test_a_malformed_body_gives_no_subject_and_no_500(client, body, content_type):
    login_policy(limit=1)
    assert {login(client, body, content_type) for _ in range(3)} <= {400, 401}


# --- addresses ------------------------------------------------------------------------------------


def test_behind_a_unix_socket_ip_policies_apply_once_unix_is_a_trusted_proxy(client, settings):
    make(limit=2)
    settings.RATELIMIT_TRUSTED_PROXIES = ["unix"]
    assert [search(client, REMOTE_ADDR="", HTTP_X_FORWARDED_FOR="198.51.100.1") for _ in range(3)] == [200, 200, 429]
    assert search(client, REMOTE_ADDR="", HTTP_X_FORWARDED_FOR="198.51.100.2") == 200


def test_an_ip_policy_meeting_no_address_says_so_once_loudly(client, caplog):
    make(limit=2)
    with caplog.at_level("WARNING", logger="ratelimit_app"):
        assert [search(client, REMOTE_ADDR="") for _ in range(5)] == [200] * 5
    warnings = [r for r in caplog.records if r.name == "ratelimit_app" and r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "RATELIMIT_TRUSTED_PROXIES" in warnings[0].getMessage() and "unix" in warnings[0].getMessage()


def test_ipv6_zone_ids_do_not_make_new_subjects(client, settings):
    settings.RATELIMIT_IPV6_PREFIX = 128
    make(limit=2)
    assert [search(client, REMOTE_ADDR=f"2001:db8::77%{i}") for i in range(4)] == [200, 200, 429, 429]


# --- memory -------------------------------------------------------------------------------------


def retained_bytes(requests) -> int:
    """Bytes still allocated after `requests` ran and garbage was collected."""
    gc.collect()
    tracemalloc.start()
    quiet = logging.getLogger("django.request")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # pytest keeps log records, and Django's 401 records hold the request
    try:
        before = tracemalloc.get_traced_memory()[0]
        requests()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        quiet.setLevel(level)


def test_distinct_huge_usernames_leave_no_memory_behind(client):
    login_policy(limit=1000)
    megabyte = 1 << 20
    login(client, "username=warm")  # what the first request loads once is not what we measure

    def attack():
        for i in range(30):
            assert login(client, f"username={i:04d}" + "u" * megabyte) == 401

    assert retained_bytes(attack) < 5 * megabyte  # 30 MB when every value was kept as a cache key


def test_distinct_huge_forwarded_for_entries_leave_no_memory_behind(client, settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.1"]
    make(limit=1000)
    megabyte = 1 << 20
    search(client)

    def attack():
        for i in range(30):
            assert search(client, REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=f"{i:04d}" + "f" * megabyte) == 200

    assert retained_bytes(attack) < 5 * megabyte


def test_distinct_long_paths_leave_no_memory_behind(client):
    make(action="*", limit=100000)
    search(client)
    long_path = 64 << 10  # a long URL, as a client may send one; every one is new

    def attack():
        for i in range(200):
            assert client.get(f"/{i:04d}" + "p" * long_path, REMOTE_ADDR="203.0.113.9").status_code == 404
        urllib.parse.clear_cache()  # the test client's urlsplit keeps the last 128 URLs; a server does not

    assert retained_bytes(attack) < 5 << 20  # 13 MB when every path was kept as a cache key
