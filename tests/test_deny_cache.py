"""The local deny cache refuses a subject over an enforcing limit from memory, and only while Redis would."""

from __future__ import annotations

import sys

import pytest
from django.test import RequestFactory

from ratelimit_app import deny_cache as deny_cache_module
from ratelimit_app import engine, limiter, live, policies
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


def test_threads_refusing_many_subjects_at_once_never_fail(monkeypatch):
    limited = policy(limit=1)
    engine.decide([check(limited)])
    refused = engine.decide([check(limited)]).decisions[0]
    assert not refused.allowed
    monkeypatch.setattr(deny_cache_module, "MAX_ENTRIES", 50)  # every remember() evicts
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change hands as often as a busy server makes them
    try:
        def flood():
            for i in range(20_000):
                subject_check = check(limited, f"ip:198.51.100.{i % 200}")
                deny_cache.remember([subject_check], [refused], deny_cache.epoch)
                deny_cache.denied([subject_check])
        _, errors = in_threads(flood, threads=4)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
