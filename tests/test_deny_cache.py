"""The local deny cache refuses a subject over an enforcing limit from memory, and only while Redis would."""

from __future__ import annotations

import sys
import threading

import pytest
from django.core.cache import caches
from django.test import RequestFactory

import ratelimit_app

from ratelimit_app import engine, limiter, live, policies
from ratelimit_app.conf import get_setting
from ratelimit_app.deny_cache import deny_cache
from tests.helpers import check, in_threads, make_policy, policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


def search(client):
    return client.get("/demo/search/?q=a", REMOTE_ADDR=IP)


def refused_in_flight(row):
    """A request of IP over `row`'s limit, refused by Redis; its worker has not kept the answer yet.
    Returns what the worker will settle with (request, state, checks, verdict, epoch)."""
    request = RequestFactory().get("/demo/search/?q=a", REMOTE_ADDR=IP)
    state = limiter.RequestState()
    checks = limiter.pending_checks(request, state)
    assert [c.policy.id for c in checks] == [row.pk]
    epoch = deny_cache.epoch  # read before Redis is asked, as the doors do
    verdict = engine.decide(checks)
    assert not verdict.allowed
    return request, state, checks, verdict, epoch


def test_a_refusal_in_flight_while_the_policy_switches_to_shadow_is_not_remembered(client):
    row = make_policy(name="search", limit=1)
    assert search(client).status_code == 200
    request, state, checks, verdict, epoch = refused_in_flight(row)
    row.mode = "shadow"  # another worker switches the policy to shadow; this one reloads its index
    row.save()
    policies.get_index()
    limiter.settle(request, state, checks, verdict, epoch)  # the refusal arrives after the reload
    assert search(client).status_code == 200  # shadow: counted and reported, never refused


def test_a_refusal_in_flight_while_the_subject_is_reset_is_not_remembered(client):
    row = make_policy(name="search", limit=1)
    assert search(client).status_code == 200
    request, state, checks, verdict, epoch = refused_in_flight(row)
    live.reset_subjects(checks[0].policy, [checks[0].subject.key])  # the operator resets this address
    limiter.settle(request, state, checks, verdict, epoch)
    assert search(client).status_code == 200  # starts afresh, as the reset promised
    assert search(client).status_code == 429


def test_a_policy_switched_to_shadow_refuses_nothing_from_memory(client):
    row = make_policy(name="search", limit=1)
    assert [search(client).status_code for _ in range(2)] == [200, 429]  # the refusal is remembered
    row.mode = "shadow"
    row.save()  # this worker reloads at its next request (the version in Redis moves on commit)
    assert search(client).status_code == 200


def test_threads_refusing_many_subjects_at_once_never_fail(settings):
    limited = policy(limit=1)
    engine.decide([check(limited)])
    refused = engine.decide([check(limited)]).decisions[0]
    assert not refused.allowed
    settings.RATELIMIT_CACHE_BYTES = 1 << 20  # the deny cache keeps under a hundred refusals: every remember() evicts
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change hands as often as a busy server makes them
    try:
        def flood():
            for i in range(20_000):
                subject_check = check(limited, f"ip:198.51.100.{i % 200}")
                deny_cache.remember([refused._replace(subject=subject_check.subject)], deny_cache.epoch)
                deny_cache.denied([subject_check])
        _, errors = in_threads(flood, threads=4)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def _hit(cost: int = 1, action: str = "export"):
    return ratelimit_app.hit(RequestFactory().get("/", REMOTE_ADDR=IP), action, cost=cost)


def test_a_larger_cost_is_not_answered_with_a_smaller_costs_wait():
    make_policy(name="export", action="export", strategy="token_bucket", limit=10, window=10, key="ip")
    assert _hit(cost=10).allowed  # the bucket is empty: a unit comes back every second
    small = _hit(cost=2)
    assert not small.allowed and small.decisions[0].retry_after <= 2
    large = _hit(cost=9)  # memory knows the wait of 2 units, not of 9
    assert not large.allowed
    assert large.decisions[0].retry_after > 8  # what Redis says: 9 units take 9 seconds to come back
    assert not _hit(cost=9).allowed  # and now remembered for 9 units, with its own wait
    assert _hit(cost=9).decisions[0].retry_after > 7


def test_a_cleared_cache_clears_the_refusals_kept_in_memory():
    make_policy(name="export", action="export", limit=1, key="ip")
    assert [_hit().allowed for _ in range(2)] == [True, False]  # the refusal is remembered
    caches[get_setting("RATELIMIT_CACHE")].clear()  # what a test suite does between tests: FLUSHDB
    assert [_hit().allowed for _ in range(2)] == [True, False]


def test_a_cache_cleared_in_another_thread_clears_the_refusals_kept_in_memory_too():
    make_policy(name="export", action="export", limit=1, key="ip")
    assert [_hit().allowed for _ in range(2)] == [True, False]
    # Django gives each thread a backend of its own (a live server's, a fixture's): none is the app's client
    cleaner = threading.Thread(target=lambda: caches[get_setting("RATELIMIT_CACHE")].clear())
    cleaner.start()
    cleaner.join()
    assert [_hit().allowed for _ in range(2)] == [True, False]


def test_another_cache_meets_none_of_the_refusals_of_the_one_before(settings, private):
    make_policy(name="export", action="export", limit=1, key="ip")
    assert [_hit().allowed for _ in range(2)] == [True, False]
    settings.CACHES = {**settings.CACHES, "other": {**settings.CACHES["default"], "LOCATION": private.url}}
    settings.RATELIMIT_CACHE = "other"  # an empty server: nothing refuses this address there
    assert [_hit().allowed for _ in range(2)] == [True, False]
