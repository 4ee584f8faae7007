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
