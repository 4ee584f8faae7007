"""The local deny cache refuses a subject over an enforcing limit from memory, and only while Redis would."""

from __future__ import annotations

import sys

import pytest

from ratelimit_app import deny_cache as deny_cache_module
from ratelimit_app import engine
from ratelimit_app.deny_cache import deny_cache
from tests.helpers import check, in_threads, policy

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def forgotten():
    deny_cache.clear()
    yield
    deny_cache.clear()


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
                deny_cache.remember([subject_check], [refused])
                deny_cache.denied([subject_check])
        _, errors = in_threads(flood, threads=4)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
