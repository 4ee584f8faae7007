"""A header value is matched as it was typed: a non-ASCII API key, which WSGI and ASGI servers hand
over as latin-1 text of its UTF-8 bytes, gets its plan and override, and the subject key of its counter
is the one `ratelimit_app.subject_key()` gives for the key written as the customer was sold it."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.db import connections
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import quotas
from ratelimit_app.models import Override, Plan, PlanAssignment, PlanLimit, QuotaUsage
from tests.helpers import make_policy

IP = "203.0.113.7"
TYPED = "clé-123"  # as the admin stores it
ON_THE_WIRE = TYPED.encode("utf-8").decode("latin-1")  # as a WSGI server puts it in the environ: 'clÃ©-123'


def key_on_a_plan():
    policy = make_policy(name="api-per-key", action="demo:search", limit=10, window=60, key="header:X-Api-Key")
    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=policy, limit=1000)
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value=TYPED)
    return policy


@pytest.mark.django_db
def test_a_non_ascii_api_key_gets_its_plan_through_wsgi(client):
    key_on_a_plan()
    response = client.get("/demo/search/?q=a", REMOTE_ADDR=IP, HTTP_X_API_KEY=ON_THE_WIRE)
    assert response["RateLimit-Policy"] == '"api-per-key";q=1000;w=60'


@pytest.mark.django_db(transaction=True)
async def test_a_non_ascii_api_key_gets_its_plan_through_asgi():
    from tests.test_async import ClientAt

    await sync_to_async(key_on_a_plan)()
    try:
        # the ASGI client sends each header's latin-1 bytes: the key's UTF-8 bytes, as a browser or curl would
        response = await ClientAt(IP).get("/demo/search/?q=a", headers={"X-Api-Key": ON_THE_WIRE})
    finally:  # the worker thread's connection would keep PostgreSQL from dropping the test database
        await sync_to_async(connections.close_all)()
    assert response["RateLimit-Policy"] == '"api-per-key";q=1000;w=60'


@pytest.mark.django_db
def test_a_non_ascii_api_key_gets_its_override(client):
    policy = make_policy(name="api-per-key", action="demo:search", limit=10, window=60, key="header:X-Api-Key")
    Override.objects.create(policy=policy, kind="header", header="X-Api-Key", value=TYPED, limit=77)
    response = client.get("/demo/search/?q=a", REMOTE_ADDR=IP, HTTP_X_API_KEY=ON_THE_WIRE)
    assert response["RateLimit-Policy"] == '"api-per-key";q=77;w=60'


@pytest.mark.django_db(transaction=True)
def test_the_saved_usage_of_a_non_ascii_key_is_found_by_subject_key(client):
    make_policy(
        name="api-month", action="demo:search", strategy="calendar_quota", period="month", time_zone="UTC",
        limit=10, window=1, key="header:X-Api-Key",
    )
    assert client.get("/demo/search/?q=a", REMOTE_ADDR=IP, HTTP_X_API_KEY=ON_THE_WIRE).status_code == 200
    assert quotas.saver.save() == 1
    assert QuotaUsage.objects.get().subject == ratelimit_app.subject_key("api-month", f"header:X-Api-Key={TYPED}")


@pytest.mark.parametrize(
    "sent, read",
    [
        ("sk_live_abc", "sk_live_abc"),  # ASCII: as it is
        (ON_THE_WIRE, TYPED),  # UTF-8 bytes read as latin-1: read back as UTF-8
        ("ключ".encode().decode("latin-1"), "ключ"),
        ("café", "café"),  # latin-1 bytes that are not UTF-8 (an old client): kept as sent
        ("clé-123", "clé-123"),  # text handed over as it is (a test client, the tester): kept
        ("ключ", "ключ"),
    ],
)
def test_a_header_is_read_as_it_was_typed(sent, read):
    from ratelimit_app.subjects import header_value

    request = RequestFactory().get("/", HTTP_X_API_KEY=sent)
    request.user = AnonymousUser()
    assert header_value(request.META, "HTTP_X_API_KEY") == read
