"""Costs at the largest value each door accepts: every one is counted in full or refused, never
admitted uncounted (a script that fails lets the request through, by the failure rule)."""

from __future__ import annotations

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.contrib.auth.models import AnonymousUser

import ratelimit_app
from ratelimit_app import engine
from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import MAX_COST, ActionCost
from tests.helpers import check, make_policy, policy

pytestmark = pytest.mark.django_db

SHAPES = {
    "fixed_window": {},
    "sliding_window": {"bucket_size": 60},
    "sliding_log": {},
    "token_bucket": {},
}
# what the doors accept: the admin's action cost up to an integer column, a computed cost near where
# INCRBY's arithmetic overflowed, and the decorator's or hit()'s cost, any Python integer
LARGEST = [MAX_COST, 10**13, 10**30]


def request(path: str = "/search/"):
    made = RequestFactory().get(path, REMOTE_ADDR="203.0.113.9")
    made.user = AnonymousUser()
    return made


@pytest.mark.parametrize("strategy", list(SHAPES))
@pytest.mark.parametrize("cost", LARGEST)
def test_a_cost_no_policy_can_hold_is_refused_and_counts_nothing(strategy, cost):
    limited = policy(strategy=strategy, limit=100, window=3600, **SHAPES[strategy])
    for _ in range(2):  # a subject's first request and a repeat take different paths
        [decision] = engine.decide([check(limited)], cost=cost).decisions
        assert (decision.allowed, decision.count, decision.never_fits) == (False, 0, True)
    assert engine.decide([check(limited)], cost=100).allowed  # the whole limit is still there


@pytest.mark.parametrize("strategy", list(SHAPES))
def test_a_shadow_policy_reports_a_cost_it_cannot_hold_without_counting_it(strategy):
    shadow = policy(strategy=strategy, limit=100, window=3600, mode="shadow", **SHAPES[strategy])
    verdict = engine.decide([check(shadow)], cost=10**30)
    assert (verdict.allowed, verdict.decisions[0].exceeded) == (True, True)
    [after] = engine.decide([check(shadow)], dry_run=True).decisions
    assert after.count == 0


@pytest.mark.parametrize("strategy", list(SHAPES))
def test_an_admin_cost_of_thousands_is_counted_in_full(client, strategy):
    """The admin accepts a cost of 4,000 against a policy of 100,000: every request is counted, 25 of
    them fill the policy, the 26th is refused."""
    make_policy(name="bulk", action="demo:search", limit=100_000, window=3600, strategy=strategy, **SHAPES[strategy])
    ActionCost.objects.create(action="demo:search", cost=4_000)
    statuses = [client.get("/demo/search/", REMOTE_ADDR="203.0.113.21").status_code for _ in range(26)]
    assert statuses == [200] * 25 + [429]


@ratelimit("export", cost=10**30)
def export(request):
    return HttpResponse("exported")


def test_the_decorators_unbounded_cost_is_refused_and_hit_counts_what_fits():
    make_policy(name="export", action="export", limit=8_000, window=3600, strategy="sliding_log")
    assert export(request()).status_code == 429
    assert ratelimit_app.hit(request(), "export", cost=8_000).allowed
    assert ratelimit_app.check(request(), "export").decisions[0].count == 8_000
    assert not ratelimit_app.hit(request(), "export", cost=1).allowed


# --- strategies that write a member per unit: one request's work in Redis is bounded ------------------

MEMBER_A_UNIT = {"sliding_log": "ratelimit_app.lua.sliding_log", "concurrency": "ratelimit_app.lua.concurrency"}


@pytest.mark.parametrize("strategy", list(MEMBER_A_UNIT))
@pytest.mark.parametrize("cost", [10_001, 10**6, MAX_COST])
def test_a_cost_above_ten_thousand_is_refused_without_a_write_under_the_largest_limit(redis_client, strategy, cost):
    """A limit of 2**31 - 1 admitted a cost of 10**6 as a million ZADD members in one script, which
    blocked Redis for seconds (10**6: BUSY for every other client). Refused now, before a write."""
    from tests.helpers import server_commands_per_call

    limited = policy(strategy=strategy, limit=MAX_COST, window=3600)
    refuse = lambda: engine.decide([check(limited)], cost=cost, lease="bulk")  # noqa: E731
    [decision] = refuse().decisions
    assert (decision.allowed, decision.count, decision.never_fits, decision.retry_after) == (False, 0, True, None)
    assert server_commands_per_call(redis_client, refuse, count=3) <= 4  # the call and a few reads, no member writes
    counters = [key for key in redis_client.scan_iter() if redis_client.type(key) == b"zset" and b":live:" not in key]
    assert counters == []  # the live index (the worker's tally) says the subject was seen, nothing more


@pytest.mark.parametrize("strategy", list(MEMBER_A_UNIT))
def test_ten_thousand_units_are_counted_in_full_and_given_back(strategy):
    from ratelimit_app.values import Held
    from tests.helpers import subject

    limited = policy(strategy=strategy, limit=MAX_COST, window=3600)
    assert engine.decide([check(limited)], cost=10_000, lease="bulk").allowed
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 10_000
    if strategy == "concurrency":
        engine.release([Held(limited, subject(), "bulk", 10_000)])
        assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 0


def test_the_admin_refuses_an_action_cost_a_member_a_unit_strategy_cannot_take(admin_client):
    make_policy(name="log", action="/api/", limit=100_000, window=3600, strategy="sliding_log")
    response = admin_client.post("/admin/ratelimit_app/actioncost/add/", {"action": "/api/export/", "cost": 20_000})
    assert response.status_code == 200
    assert "more than policy &#x27;log&#x27; allows at once (10000)" in response.content.decode()
    assert not ActionCost.objects.exists()


def test_a_policy_cannot_move_to_a_strategy_that_cannot_take_an_existing_cost():
    from django.core.exceptions import ValidationError

    ActionCost.objects.create(action="/api/export/", cost=20_000)
    row = make_policy(name="api", action="/api/", limit=100_000, window=3600, strategy="fixed_window")
    row.strategy = "concurrency"
    with pytest.raises(ValidationError, match="allows at once \\(10000\\).*Choose another strategy"):
        row.full_clean()


def test_a_code_cost_above_a_strategys_bound_stops_at_startup():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="10000"):
        ratelimit(rate="100000/h", strategy="sliding_log", cost=20_000)(lambda request: HttpResponse())
