"""ratelimit_app.compat.drf beyond DRF's own tests: policies in the admin, the operator's changes,
overrides, one round trip, exactness under concurrent processes, headers, failing closed."""

from __future__ import annotations


import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import override_settings
from rest_framework.test import APIRequestFactory

from ratelimit_app.engine import clients
from ratelimit_app.compat.drf import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle
from ratelimit_app.models import Override, Policy
from ratelimit_app import engine, registry
from ratelimit_app.policies import compile_policy
from tests.helpers import check, count_round_trips, in_processes, make_policy

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.compat_urls")]

RATES = {"DEFAULT_THROTTLE_RATES": {"anon": "3/m", "items": "5/m", "user": None}}


def get(view, ip="203.0.113.7", **headers):
    request = APIRequestFactory().get("/items/", REMOTE_ADDR=ip, **headers)
    request.user = AnonymousUser()
    return view(request)


def two_throttles():
    """A view with two compat throttles (imported here: declared at collection, their policies would be in
    every test's database)."""
    from tests.compat_throttles import TwoThrottles

    return TwoThrottles.as_view()


@override_settings(REST_FRAMEWORK=RATES)
def test_every_rate_of_the_settings_shows_in_the_admin_as_a_policy_from_code(admin_client):
    registry.sync_pending()  # as at a process's first request
    rows = {row.name: row for row in Policy.objects.filter(source="code", name__startswith="drf-")}
    assert (rows["drf-anon"].limit, rows["drf-anon"].window, rows["drf-anon"].key) == (3, 60, "ip")
    assert (rows["drf-items"].limit, rows["drf-items"].key, rows["drf-items"].strategy) == (5, "user_or_ip", "sliding_log")
    assert "drf-user" not in rows  # a rate of None limits nothing
    assert '<td class="field-origin">code</td>' in admin_client.get("/admin/ratelimit_app/policy/").content.decode()


@override_settings(REST_FRAMEWORK=RATES)
def test_the_compat_throttles_deny_with_drfs_429_and_retry_after(client):
    statuses = [client.get("/items/").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    refused = client.get("/items/")
    assert refused.status_code == 429 and 55 <= int(refused["Retry-After"]) <= 60


@override_settings(REST_FRAMEWORK=RATES)
def test_responses_carry_the_ratelimit_headers_through_the_middleware(client):
    response = client.get("/items/")
    assert response["RateLimit-Policy"] == '"drf-anon";q=3;w=60, "drf-items";q=5;w=60'
    assert response["RateLimit"].startswith('"drf-anon";r=2;t=')


@override_settings(REST_FRAMEWORK=RATES)
def test_the_operators_limit_in_the_admin_wins_over_the_settings(client):
    registry.sync_pending()  # as at a process's first request
    Policy.objects.filter(name="drf-anon").update(limit=1)
    Policy.objects.get(name="drf-anon").save()  # as the admin saves: every worker reloads
    assert [client.get("/items/").status_code for _ in range(2)] == [200, 429]


@override_settings(REST_FRAMEWORK=RATES)
def test_shadow_mode_and_disabling_in_the_admin_stop_denying(client):
    registry.sync_pending()  # as at a process's first request
    anon = Policy.objects.get(name="drf-anon")
    anon.mode = "shadow"
    anon.save()
    items = Policy.objects.get(name="drf-items")
    items.enabled = False
    items.save()
    assert {client.get("/items/").status_code for _ in range(8)} == {200}


@override_settings(REST_FRAMEWORK=RATES)
def test_an_override_exempts_an_address(client):
    registry.sync_pending()  # as at a process's first request
    for name in ("drf-anon", "drf-items"):
        Override.objects.create(policy=Policy.objects.get(name=name), kind="ip", network="203.0.113.0/24", exempt=True)
    assert {client.get("/items/", REMOTE_ADDR="203.0.113.9").status_code for _ in range(8)} == {200}
    assert [client.get("/items/", REMOTE_ADDR="198.51.100.1").status_code for _ in range(4)][-1] == 429


@override_settings(REST_FRAMEWORK=RATES)
def test_the_live_page_shows_the_throttles_subjects_and_reset_lets_them_in_again(admin_client, client):
    for _ in range(4):
        client.get("/items/", REMOTE_ADDR="198.51.100.2")
    anon = Policy.objects.get(name="drf-anon")
    live = f"/admin/ratelimit_app/policy/{anon.pk}/live/"
    subjects = admin_client.get(live + "?format=json").json()["subjects"]
    assert [(s["subject"], s["count"], s["blocked"]) for s in subjects] == [("throttle_anon_198.51.100.2", 3, True)]
    admin_client.post(live + "reset/", {"subject": subjects[0]["key"]})
    assert client.get("/items/", REMOTE_ADDR="198.51.100.2").status_code == 200


def test_a_throttle_class_with_its_own_rate_shows_in_the_admin_before_any_request():
    class Uploads(UserRateThrottle):
        scope = "uploads"
        rate = "20/h"

    registry.sync_pending()  # as at a process's first request
    row = Policy.objects.get(name="drf-uploads-uploads")
    assert (row.source, row.limit, row.window, row.key) == ("code", 20, 3600, "user_or_ip")


def test_several_compat_throttles_of_a_view_cost_one_round_trip():
    view = two_throttles()
    get(view, HTTP_X_API_KEY="k1")  # loads the policies and writes their rows
    with count_round_trips() as trips:
        assert get(view, HTTP_X_API_KEY="k1").status_code == 429  # PerApiKey: 1/m
    assert trips[0] == 1


def test_a_subclass_with_its_own_cache_key_counts_by_it():
    view = two_throttles()
    assert get(view, HTTP_X_API_KEY="k1").status_code == 200
    assert get(view, ip="198.51.100.3", HTTP_X_API_KEY="k1").status_code == 429  # the same key elsewhere
    assert get(view, ip="198.51.100.3", HTTP_X_API_KEY="k2").status_code == 200
    assert Policy.objects.get(name="drf-perapikey").limit == 1


def test_a_refused_request_is_counted_by_no_throttle_of_the_view():
    view = two_throttles()
    assert get(view, HTTP_X_API_KEY="k1").status_code == 200  # Burst (2/m per address): 1
    assert get(view, HTTP_X_API_KEY="k1").status_code == 429  # refused by PerApiKey: Burst still 1 (DRF: 2)
    assert get(view).status_code == 200  # no key, so only Burst: its second request
    assert get(view).status_code == 429


@pytest.mark.usefixtures("outage_forgotten")
def test_fail_closed_answers_503_when_redis_is_down(settings):
    settings.RATELIMIT_FAIL_OPEN = False  # the settings fixture only: mixed with override_settings it would leak
    view = two_throttles()
    get(view, HTTP_X_API_KEY="k1")
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    try:
        assert get(view, HTTP_X_API_KEY="k9").status_code == 503
    finally:
        engine.breaker.reset()


def test_rate_none_allows_everything_without_asking_redis():
    class Unlimited(AnonRateThrottle):
        rate = None
        THROTTLE_RATES = {"anon": None}

    with count_round_trips() as trips:
        assert Unlimited().allow_request(None, None) is True
    assert trips[0] == 0


# --- exactness under concurrency ---------------------------------------------------------------


def _attempts(start, results):
    from tests.compat_throttles import Hundred

    start.wait()
    clients.forget_clients()  # a fresh connection in each process, as every worker has
    admitted = 0
    for _ in range(100):
        request = APIRequestFactory().get("/", REMOTE_ADDR="203.0.113.50")
        request.user = AnonymousUser()
        admitted += Hundred().allow_request(request, None)
    results.put(admitted)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_processes_hitting_one_subject_admit_exactly_the_limit():
    from tests.compat_throttles import Hundred

    request = APIRequestFactory().get("/", REMOTE_ADDR="198.51.100.99")
    request.user = AnonymousUser()
    assert Hundred().allow_request(request, None)  # writes the policy's row and loads it before forking
    assert sum(in_processes(_attempts)) == 100


@override_settings(REST_FRAMEWORK=RATES)
def test_with_the_middleware_the_throttles_and_the_sites_policies_are_one_call_all_or_nothing(client):
    everywhere = make_policy(name="everywhere", action="*", limit=1000, key="ip")
    client.get("/items/")  # loads the policies and writes the throttles' rows
    with count_round_trips() as trips:
        assert client.get("/items/").status_code == 200
    assert trips[0] == 1  # the middleware left the call to the throttles, which decided both
    assert [client.get("/items/").status_code for _ in range(3)] == [200, 429, 429]  # anon: 3/m
    counted = engine.decide([check(compile_policy(everywhere), "ip:127.0.0.1")], dry_run=True).decisions[0].count
    assert counted == 3  # the two refused requests were counted nowhere


def test_anon_and_user_throttles_keep_their_scope_whatever_the_base_class_says(monkeypatch):
    # DRF's own classes define their scope; ours must not inherit it through SimpleRateThrottle, first in the MRO
    monkeypatch.setattr(SimpleRateThrottle, "scope", "changed", raising=False)
    assert AnonRateThrottle.scope == "anon" and AnonRateThrottle().scope == "anon"
    assert UserRateThrottle.scope == "user"
