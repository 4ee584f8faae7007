"""The harmless review's first defect: with the database away, a policy reload that fell due (its
interval, or Redis restarted or emptied) answered 500 to every request, and tried the database again
on every one. The policies loaded last now stay in force, and the database is read again once a second."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ratelimit_app import policies
from tests.faults.test_boundary import _renamed
from tests.helpers import make_policy

pytestmark = [pytest.mark.django_db(transaction=True)]
PATH = "/door/middleware/sync"


@pytest.fixture
def site(settings):
    settings.ROOT_URLCONF = "tests.faults.matrix_site"


def _statuses(client: Client, count: int) -> list[int]:
    return [client.get(PATH).status_code for _ in range(count)]


@pytest.mark.parametrize("due", ["redis-emptied", "interval"])
def test_a_reload_due_while_the_database_is_away_keeps_the_policies_loaded_in_force(site, settings, redis_client,
                                                                                   due):
    make_policy(name="per-ip", action="/door/middleware/", limit=3)
    client = Client()
    assert _statuses(client, 2) == [200, 200]  # loaded, counted
    with _renamed("ratelimit_app_policy"), CaptureQueriesContext(connection) as queries:
        if due == "redis-emptied":
            redis_client.flushall()  # a restart without persistence: the version moved, a reload is due
            settings.RATELIMIT_POLICY_RECHECK_SECONDS = 0.0  # the next decision brings the version back
        else:
            settings.RATELIMIT_POLICY_RELOAD_SECONDS = 0.0  # the safety net's interval has run out
        found = _statuses(client, 6)
        assert policies.load_failure() is not None  # the reload was tried, and failed
    # the policy loaded before still counts and refuses (after a FLUSHALL, from zero)
    assert found == ([200, 200, 200, 429, 429, 429] if due == "redis-emptied" else [200, 429, 429, 429, 429, 429])
    reads = [q for q in queries.captured_queries if "ratelimit_app_policy" in q["sql"]]
    assert len(reads) <= 2  # once, and at most once more a second later: not per request


def test_the_database_back_the_policies_are_read_again(site, settings, redis_client):
    make_policy(name="per-ip", action="/door/middleware/", limit=3)
    client = Client()
    assert _statuses(client, 1) == [200]
    with _renamed("ratelimit_app_policy"):
        redis_client.flushall()
        assert _statuses(client, 1) == [200]
    policies._state.retry_at = 0.0  # a second went by
    make_policy(name="tighter", action="/door/middleware/", limit=1)
    assert _statuses(client, 2) == [200, 429]  # the new policy is in force: the rows were read again
    assert policies.load_failure() is None


def test_the_age_of_the_policies_in_force_shows_in_status_and_on_the_live_page(site, settings, redis_client,
                                                                              admin_client):
    from io import StringIO

    from django.core.management import call_command

    from ratelimit_app.engine.tally import tally

    row = make_policy(name="per-ip", action="/door/middleware/", limit=3)
    client = Client()
    assert _statuses(client, 1) == [200]
    live = f"/admin/ratelimit_app/policy/{row.pk}/live/?format=json"
    assert admin_client.get(live).json()["policies"]["error"] is None
    with _renamed("ratelimit_app_policy"):
        settings.RATELIMIT_POLICY_RELOAD_SECONDS = 0.0
        assert _statuses(client, 1) == [200]
        tally._heartbeat_due = 0.0
        tally._heartbeat()  # the worker says, with its totals, how old its policies are
    shown = admin_client.get(live).json()["policies"]
    assert "ratelimit_app_policy" in shown["error"] and shown["loaded_ago"] >= 0
    out = StringIO()
    call_command("ratelimit", "status", stdout=out)
    assert "Policies in force on 1 worker(s)" in out.getvalue()
    assert "the database cannot be read" in out.getvalue() and "stay in force" in out.getvalue()
