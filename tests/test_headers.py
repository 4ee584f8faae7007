"""The RateLimit headers as draft-ietf-httpapi-ratelimit-headers-11 reads them: quota units, the items
of both fields, and Retry-After beside `t`, on real responses of the middleware."""

from __future__ import annotations

import re

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import RequestFactory

from ratelimit_app.decorators import ratelimit
from ratelimit_app.middleware import RateLimitMiddleware
from tests.helpers import make_policy

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.inflight_urls")]

IP = "203.0.113.7"
# One List member of either field: a String key and its parameters (draft 11, sections 2 and 3)
ITEM = re.compile(r'^"(?P<name>[^"\\]+)"(?P<params>(;[a-z]+=("[^"]*"|\d+))+)$')


def members(field: str) -> dict[str, dict[str, str]]:
    parsed = {}
    for member in field.split(", "):
        found = ITEM.match(member)
        assert found, f"not a Structured Field item: {member!r}"
        parsed[found["name"]] = dict(p.split("=", 1) for p in found["params"].lstrip(";").split(";"))
    return parsed


def held(count: int):
    """`count` responses of the middleware whose streamed bodies are not sent yet (their places held)."""
    middleware = RateLimitMiddleware(lambda request: StreamingHttpResponse(iter(["ok"])))
    return [middleware(RequestFactory().get("/plain/", REMOTE_ADDR=IP)) for _ in range(count)]


def test_an_in_flight_policy_is_announced_in_concurrent_requests_with_no_window():
    make_policy(name="report-in-flight", action="*", limit=2, window=300, strategy="concurrency")
    make_policy(name="per-minute", action="*", limit=100, window=60)
    first, second, refused = held(3)
    policy = members(first["RateLimit-Policy"])
    assert policy["report-in-flight"] == {"q": "2", "qu": '"concurrent-requests"'}
    assert policy["per-minute"] == {"q": "100", "w": "60"}  # "requests", the default unit: no qu
    assert members(first["RateLimit"])["report-in-flight"]["r"] == "1"
    assert members(second["RateLimit"])["report-in-flight"]["r"] == "0"
    assert refused.status_code == 429
    # Retry-After beside t: never sooner than the refusing policy's t, so a client may follow either
    state = members(refused["RateLimit"])["report-in-flight"]
    assert state["r"] == "0" and int(refused["Retry-After"]) >= int(state["t"])
    for response in (first, second, refused):
        response.close()


def test_a_policy_of_costly_requests_still_counts_in_requests():
    make_policy(name="uploads", action="upload", limit=10, window=60)
    view = ratelimit("upload", cost=4)(lambda request: HttpResponse("stored"))
    response = view(RequestFactory().post("/upload/", REMOTE_ADDR=IP))
    assert members(response["RateLimit-Policy"]) == {"uploads": {"q": "10", "w": "60"}}
    state = members(response["RateLimit"])["uploads"]
    assert set(state) == {"r", "t"} and state["r"] == "6"  # units of requests, weighted; no pk: subjects stay private


def test_one_policys_headers_read_as_djangos_header_setter_writes_them():
    name = "per-minute"
    # one policy's headers skip Django's setter when it would store them unchanged: the same bytes either way
    make_policy(name=name, action="*", limit=100, window=60)
    response = RateLimitMiddleware(lambda request: HttpResponse("ok"))(RequestFactory().get("/plain/", REMOTE_ADDR=IP))
    expected = HttpResponse()
    expected.headers["RateLimit-Policy"] = f'"{name}";q=100;w=60'
    assert response.headers["RateLimit-Policy"] == expected.headers["RateLimit-Policy"]
    assert [key for key, _ in response.items() if key.lower().startswith("ratelimit")] == ["RateLimit-Policy",
                                                                                           "RateLimit"]
    assert response.headers["RateLimit"].startswith(expected.headers["RateLimit-Policy"].split(";")[0] + ";r=99;t=")


def test_a_policy_of_response_bytes_says_content_bytes_and_a_named_unit_goes_unsaid():
    make_policy(name="download-bytes", action="download", limit=50_000_000, window=3600, unit="content-bytes")
    make_policy(name="chat-tokens", action="download", limit=20_000, window=60, unit="tokens")
    view = ratelimit("download", cost=1000)(lambda request: HttpResponse("x"))
    response = view(RequestFactory().get("/download/", REMOTE_ADDR=IP))
    policy = members(response["RateLimit-Policy"])
    assert policy["download-bytes"] == {"q": "50000000", "w": "3600", "qu": '"content-bytes"'}
    # the draft's registry has no tokens: `q` and `r` count them without a qu a client could not read
    assert policy["chat-tokens"] == {"q": "20000", "w": "60"}
    state = members(response["RateLimit"])
    assert state["download-bytes"]["r"] == "49999000" and state["chat-tokens"]["r"] == "19000"  # the estimate taken
