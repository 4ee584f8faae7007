"""Policy changes always arrive: a version that never repeats, bumps retried until Redis takes them,
and a reload at a bounded interval whatever happened to Redis."""

from __future__ import annotations

import time

import pytest

from ratelimit_app import engine, policies
from ratelimit_app.engine import keys, version
from ratelimit_app.operations import reset_all
from ratelimit_app.models import Policy
from tests.helpers import check, make_policy

pytestmark = pytest.mark.django_db


def limit_seen_by_this_worker(row: Policy) -> int | None:
    """The limit this process enforces, after observing the version a decision call returns."""
    compiled = next((p for p in policies.get_index().policies if p.id == row.pk), None)
    if compiled is not None:
        policies.observe_version(engine.decide([check(compiled)], dry_run=True).version)
    found = next((p for p in policies.get_index().policies if p.id == row.pk), None)
    return found and found.limit


def changed_elsewhere(row: Policy, **fields) -> None:
    """Another worker's change: the database row and a version bump, nothing in this process."""
    Policy.objects.filter(pk=row.pk).update(**fields)
    version.bump_version()


def test_a_version_that_restarts_cannot_hide_a_change(redis_client, policy_row):
    for limit in (11, 12, 13):  # three changes: a counter would stand at 3
        changed_elsewhere(policy_row, limit=limit)
    assert limit_seen_by_this_worker(policy_row) == 13
    redis_client.flushall()  # a new Redis: a counter would start again from 0
    for limit in (21, 22, 23):  # ... and three saves bring it back to 3
        changed_elsewhere(policy_row, limit=limit)
    assert limit_seen_by_this_worker(policy_row) == 23


def test_the_index_reloads_after_flushall_even_without_a_change(redis_client, policy_row):
    assert limit_seen_by_this_worker(policy_row) == 10
    Policy.objects.filter(pk=policy_row.pk).update(limit=5)  # a change whose bump was lost with the data
    redis_client.flushall()
    assert limit_seen_by_this_worker(policy_row) == 5


@pytest.fixture
def policy_row(settings):
    settings.RATELIMIT_POLICY_RECHECK_SECONDS = 0  # every decision call brings the version back
    row = make_policy(limit=10)
    policies.get_index()
    return row


@pytest.fixture
def dead_redis(settings):
    """Point the app at a port where nothing listens, until the test calls the returned function."""
    settings.RATELIMIT_BREAKER_SECONDS = 0.05
    caches = settings.CACHES
    settings.CACHES = {**caches, "default": {**caches["default"], "LOCATION": "redis://127.0.0.1:1/0"}}

    def revive():
        settings.CACHES = caches

    return revive


def wait_for(condition, timeout=20.0) -> bool:
    """Poll until `condition()` holds; the timeout only stops a wait that would never end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("change", ["save", "reset all"])
def test_a_failed_bump_is_retried_until_redis_takes_it(redis_client, dead_redis, policy_row, change):
    before = redis_client.get(keys.version_key())
    if change == "save":
        policy_row.limit = 3
        policy_row.save()
    else:
        reset_all(policy_row)
    policies._publish_change()  # what on_commit runs: Redis is down now
    assert redis_client.get(keys.version_key()) == before
    dead_redis()
    assert wait_for(lambda: redis_client.get(keys.version_key()) != before)
    assert wait_for(lambda: not version.pending_bump())


def test_every_worker_reloads_its_index_at_a_bounded_interval(settings, policy_row):
    settings.RATELIMIT_POLICY_RELOAD_SECONDS = 0.2
    assert limit_seen_by_this_worker(policy_row) == 10
    Policy.objects.filter(pk=policy_row.pk).update(limit=4)  # changed, and no bump ever arrived
    assert wait_for(lambda: limit_seen_by_this_worker(policy_row) == 4)  # long before the default 30 s


def test_the_safety_net_reload_is_30_seconds_by_default():
    from ratelimit_app.conf import DEFAULTS

    assert 0 < DEFAULTS["RATELIMIT_POLICY_RELOAD_SECONDS"] <= 30
