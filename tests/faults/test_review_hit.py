"""Places taken by ratelimit_app.hit() or ahit() in a view, on a site that enforces only by calling
them (no RateLimitMiddleware, no decorator): they go back when the request ends."""

from __future__ import annotations

from functools import partial

import pytest
from django.test import AsyncClient, Client

from tests.helpers import make_policy

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.inflight_urls")]

IP = "203.0.113.7"
make = partial(make_policy, name="inflight-per-ip", action="inflight", limit=2, window=60, strategy="concurrency")


@pytest.fixture
def without_middleware(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "ratelimit_app" not in m]


def test_sequential_requests_counted_by_hit_alone_are_never_refused_by_finished_ones(without_middleware):
    make()
    client = Client()
    statuses = [client.get("/hit/", REMOTE_ADDR=IP).status_code for _ in range(10)]
    assert statuses == [200] * 10, f"{statuses.count(429)} of 10 refused"


@pytest.mark.django_db(transaction=True)  # the policy is read from the event loop's own thread
async def test_sequential_requests_counted_by_ahit_alone_are_never_refused_by_finished_ones(without_middleware):
    from asgiref.sync import sync_to_async

    await sync_to_async(make)()
    client = AsyncClient()
    statuses = [(await client.get("/hit/async/", REMOTE_ADDR=IP)).status_code for _ in range(10)]
    assert statuses == [200] * 10, f"{statuses.count(429)} of 10 refused"
