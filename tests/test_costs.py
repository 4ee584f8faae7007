"""Requests that cost more than one unit: from the decorator, hit(), DRF; exact, all-or-nothing,
headers in units, and a cost that can never fit refused where it is declared or answered plainly."""

from __future__ import annotations

import json
from functools import partial

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.http import HttpResponse
from django.test import RequestFactory
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

import ratelimit_app
from ratelimit_app import engine, registry
from ratelimit_app.decorators import ratelimit
from ratelimit_app.deny_cache import deny_cache
from ratelimit_app.throttling import PolicyThrottle
from tests.helpers import check, in_processes, make_policy, policy

pytestmark = pytest.mark.django_db

STRATEGIES = {
    "fixed_window": {},
    "sliding_window": {"bucket_size": 60},
    "sliding_log": {},
    "token_bucket": {"burst": 300},
}
make = partial(make_policy, name="search", action="search", limit=10, window=60)


def request(ip="203.0.113.7", path="/search/"):
    made = RequestFactory().get(path, REMOTE_ADDR=ip)
    made.user = AnonymousUser()
    return made


@ratelimit("search", cost=4)
def search(request):
    return HttpResponse("found")


@ratelimit("search", cost=lambda request: int(request.GET.get("pages", "1")))
def pages(request):
    return HttpResponse("pages")


# --- exact under concurrency, all-or-nothing ----------------------------------------------------


def _costly(compiled, start, results, attempts=100):
    start.wait()
    results.put(sum(engine.decide([check(compiled)], cost=3).allowed for _ in range(attempts)))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_eight_processes_of_cost_3_against_300_admit_exactly_100(strategy):
    limited = policy(strategy=strategy, limit=300, window=3600, **STRATEGIES[strategy])
    assert sum(in_processes(_costly, (limited,))) == 100
    [decision] = engine.decide([check(limited)], dry_run=True).decisions
    assert (decision.count, decision.remaining) == (300, 0)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_refused_request_charges_nothing_anywhere(strategy):
    roomy = policy(strategy=strategy, limit=100, window=60, **({"burst": 100} if strategy == "token_bucket" else {}))
    tight = policy(limit=5, window=60)
    assert engine.decide([check(roomy), check(tight)], cost=4).allowed
    refused = engine.decide([check(roomy), check(tight)], cost=4)  # 4 + 4 > 5
    assert not refused.allowed
    after = engine.decide([check(roomy), check(tight)], dry_run=True).decisions
    assert [d.count for d in after] == [4, 4]


def test_a_cost_above_the_limit_is_refused_without_a_retry_time():
    tight = policy(limit=5)
    [decision] = engine.decide([check(tight)], cost=6).decisions
    assert (decision.allowed, decision.retry_after, decision.never_fits) == (False, None, True)
    assert engine.decide([check(tight)], cost=5).allowed  # it charged nothing


def test_the_token_bucket_retry_is_when_n_tokens_are_there():
    bucket = policy(strategy="token_bucket", limit=60, window=60, burst=10)  # one token a second
    assert engine.decide([check(bucket)], now=1_800_000_000, cost=8).allowed
    [refused] = engine.decide([check(bucket)], now=1_800_000_000, cost=5).decisions
    assert (refused.allowed, refused.remaining, refused.retry_after) == (False, 2, 3.0)  # 3 more tokens in 3 s
    assert not engine.decide([check(bucket)], now=1_800_000_002.9, cost=5).allowed
    assert engine.decide([check(bucket)], now=1_800_000_003, cost=5).allowed


# --- the doors -------------------------------------------------------------------------------------


def test_the_decorator_cost_takes_units_and_the_headers_count_them():
    make(limit=10)
    first = search(request())
    assert first["RateLimit"].startswith('"search";r=6;')
    assert search(request())["RateLimit"].startswith('"search";r=2;')
    refused = search(request())
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert "costs 4 units" in refused.content.decode()
    assert ratelimit_app.check(request(), "search").decisions[0].count == 8  # the refusal took nothing


def test_a_cost_computed_per_request_and_one_that_never_fits():
    make(limit=10)
    assert pages(request(path="/search/?pages=3")).status_code == 200
    never = pages(RequestFactory().get("/search/?pages=11", REMOTE_ADDR="203.0.113.7", HTTP_ACCEPT="application/json"))
    assert never.status_code == 429
    assert "Retry-After" not in never
    body = json.loads(never.content)
    assert "never be admitted" in body["detail"] and body["cost"] == 11 and "retry_after" not in body
    assert pages(request(path="/search/?pages=7")).status_code == 200  # 3 + 7: nothing was charged meanwhile


def test_hit_and_ahit_take_a_cost():
    make(limit=10)
    assert ratelimit_app.hit(request(), "search", cost=6).decisions[0].remaining == 4
    verdict = ratelimit_app.hit(request(), "search", cost=5)
    assert (verdict.allowed, verdict.decisions[0].remaining) == (False, 4)


@pytest.mark.django_db(transaction=True)
async def test_ahit_takes_a_cost_too():
    from asgiref.sync import sync_to_async

    await sync_to_async(make)(limit=10)
    assert (await ratelimit_app.ahit(request(), "search", cost=7)).decisions[0].remaining == 3
    assert not (await ratelimit_app.ahit(request(), "search", cost=4)).allowed


class Expensive(APIView):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "search"
    throttle_cost = 3

    def get(self, request):
        return Response({"ok": True})


class PerPage(Expensive):
    def get_throttle_cost(self, request):
        return int(request.query_params.get("pages", "1"))


def test_drf_views_say_their_cost():
    make(limit=10)
    view = Expensive.as_view()
    answers = [view(APIRequestFactory().get("/api/search/", REMOTE_ADDR="203.0.113.9")) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert ratelimit_app.check(request(ip="203.0.113.9"), "search").decisions[0].remaining == 1
    per_page = PerPage.as_view()
    assert per_page(APIRequestFactory().get("/api/search/?pages=1", REMOTE_ADDR="203.0.113.9")).status_code == 200
    never = per_page(APIRequestFactory().get("/api/search/?pages=20", REMOTE_ADDR="203.0.113.10"))
    assert never.status_code == 429 and "Retry-After" not in never


def test_a_bad_cost_from_code_is_refused_at_import():
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        ratelimit("search", cost=0)
    with pytest.raises(TypeError, match="whole number"):
        ratelimit("search", cost=2.5)
    with pytest.raises(ImproperlyConfigured, match="costs 6 units, more than the policy allows at once"):
        ratelimit(rate="5/m", cost=6)(lambda request: HttpResponse())


def test_a_fixed_cost_above_a_policy_of_its_action_fails_the_database_checks():
    make(limit=3)  # @ratelimit("search", cost=4) above: never fits
    with pytest.raises(SystemCheckError, match="ratelimit_app.E018"):
        call_command("check", databases=["default"])
    registry.note_cost("search", 2)  # the largest fixed cost is the one checked
    assert registry.code_costs()["search"][0] == 4


@pytest.mark.parametrize("view, cost", [("Half", "2.5"), ("Free", "0"), ("Text", "'x'")])
def test_a_drf_views_unusable_throttle_cost_fails_check_e018_naming_the_view(settings, view, cost):
    settings.ROOT_URLCONF = "tests.bad_cost_urls"
    messages = [m.msg for m in run_checks() if m.id == "ratelimit_app.E018"]
    assert any(m.startswith(f"tests.bad_cost_urls.{view}.throttle_cost = {cost}: ") for m in messages), messages
    assert not any("Fine" in m for m in messages)


@pytest.mark.parametrize("path", ["/half/", "/free/", "/text/"])
def test_a_drf_views_unusable_throttle_cost_is_never_a_500_nor_silently_one_unit(settings, client, caplog, path):
    settings.ROOT_URLCONF = "tests.bad_cost_urls"
    make(limit=2)
    answers = [client.get(path).status_code for _ in range(3)]
    assert answers == [200, 200, 429]  # counted, one unit each, as a view that gives no cost
    refused = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and "throttle_cost" in r.getMessage()]
    assert len(refused) == 1 and "is not used" in refused[0] and "ratelimit_app.E018" in refused[0]  # said once


def test_a_fixed_drf_throttle_cost_above_a_policy_fails_the_database_checks(settings):
    settings.ROOT_URLCONF = "tests.bad_cost_urls"
    make(name="fine", action="fine", limit=1)  # Fine costs 2 units of 'fine', its throttle_scope
    assert not [m for m in run_checks() if "'fine' costs" in m.msg]  # a row is read with --database only
    messages = [m.msg for m in run_checks(databases=["default"]) if m.id == "ratelimit_app.E018"]
    assert "tests.bad_cost_urls.Fine.throttle_cost: a request of 'fine' costs 2 units, more than policy 'fine' allows at once (1): it could never be admitted." in messages


# --- the deny cache ---------------------------------------------------------------------------------


def test_a_subject_refused_at_a_high_cost_is_still_admitted_at_a_lower_one(settings):
    settings.RATELIMIT_DENY_CACHE = True
    deny_cache.clear()
    make(limit=10)
    assert ratelimit_app.hit(request(), "search", cost=8).allowed
    assert not ratelimit_app.hit(request(), "search", cost=5).allowed  # remembered for 5 units or more
    assert not ratelimit_app.hit(request(), "search", cost=6).allowed
    assert ratelimit_app.hit(request(), "search", cost=2).allowed


# --- the admin's cost ---------------------------------------------------------------------------------


def test_the_admins_cost_is_charged_through_the_middleware(client):
    from ratelimit_app.models import ActionCost

    make_policy(name="demo-search", action="demo:search", limit=10, window=60)
    ActionCost.objects.create(action="demo:search", cost=4)
    responses = [client.get("/demo/search/", REMOTE_ADDR="203.0.113.20") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[1]["RateLimit"].startswith('"demo-search";r=2;')


def test_the_admins_cost_wins_over_the_codes():
    from ratelimit_app.models import ActionCost

    make(limit=10)
    ActionCost.objects.create(action="search", cost=2)
    assert search(request())["RateLimit"].startswith('"search";r=8;')  # the code says 4, the admin 2


@pytest.mark.django_db(transaction=True)
async def test_an_async_decorated_view_takes_its_cost():
    from asgiref.sync import sync_to_async

    @ratelimit("search", cost=3)
    async def view(request):
        return HttpResponse("ok")

    await sync_to_async(make)(limit=10)
    answers = [await view(request()) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[2]["RateLimit"].startswith('"search";r=1;')
