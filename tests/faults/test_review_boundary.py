"""The boundary (ratelimit_app/boundary.py) attacked where the fault matrix does not walk: the compat
drop-ins meeting a site policy's broken key function or a database away at a worker's first request, on
gunicorn with several workers too; the database's outage logged per retry; testing.reset() and the faults."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test import Client

from ratelimit_app import boundary, policies, testing
from ratelimit_app.models import Policy
from tests import servers
from ratelimit_app.registry import known
from tests.faults.test_boundary import _closed_port, _renamed, _writes_refused

pytestmark = [pytest.mark.django_db(transaction=True)]

BROKEN_KEY = "tests.faults.review_boundary_site.broken_key"
COMPAT = ["/compat/drf", "/compat/decorated"]


@pytest.fixture
def site(settings):
    settings.ROOT_URLCONF = "tests.faults.review_boundary_site"
    settings.RATELIMIT_FAIL_OPEN = True  # django-ratelimit's drop-in follows it only when it is written


def _policy(**fields) -> Policy:
    row = Policy(**{"limit": 100000, "window": 60, "strategy": "fixed_window", "key": "ip", **fields})
    row.full_clean()
    row.save()
    return row


def _statuses(paths, times: int = 1) -> list[int]:
    client = Client(raise_request_exception=False)
    return [client.get(path).status_code for path in paths for _ in range(times)]


@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
def test_a_compat_drf_throttle_meeting_a_broken_key_function_follows_the_failure_rule(site, settings, fail_open):
    # the middleware leaves the call to the compat throttle, which decides the site's own policies with
    # its own: a key function of the site's that raises was a 500
    settings.RATELIMIT_FAIL_OPEN = fail_open
    _policy(name="everything", action="*", key=BROKEN_KEY)
    response = Client(raise_request_exception=False).get("/compat/drf")
    assert response.status_code == (200 if fail_open else 503), response.content[:200]
    if not fail_open:
        assert response.headers["Retry-After"] == "1"
    assert boundary.faults.counts.get("builtins.RuntimeError"), "the fault is counted"


def test_the_compat_doors_with_the_database_away_at_the_first_request_follow_the_failure_rule(site):
    _policy(name="everything", action="*")
    with _renamed("ratelimit_app_policy"):
        policies.forget_index()  # a worker that never loaded its policies
        statuses = _statuses(COMPAT, times=3)
    assert statuses == [200] * 6, statuses  # was [500] * 6
    assert boundary.faults.counts.get("ratelimit_app.policies.PoliciesUnreadable", 0) >= 6  # and counted


def test_the_database_away_is_logged_once_a_minute_not_at_every_retry(site, caplog):
    _policy(name="everything", action="*")
    client = Client()
    assert client.get("/plain").status_code == 200  # the policies are loaded
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    with _renamed("ratelimit_app_policy"):
        statuses = []
        for _ in range(200):
            policies._state.retry_at = 0.0  # each request finds the second between two retries passed
            policies._state.stale = True
            statuses.append(client.get("/plain").status_code)
    said = [record for record in caplog.records if "cannot be read from the database" in record.getMessage()]
    assert statuses == [200] * 200
    assert len(said) == 1, len(said)  # was 200: one line per retry, 60 a minute per worker


def test_rows_of_code_policies_that_cannot_be_written_are_logged_once_a_minute(site, settings, caplog):
    settings.RATELIMIT_POLICIES = [{"name": "declared-here", "action": "/plain", "rate": "100000/m", "key": "ip"}]
    caplog.set_level(logging.ERROR, logger="ratelimit_app")
    client = Client()
    with _writes_refused("ratelimit_app_policy"):
        statuses = []
        for _ in range(200):
            known._registry.retry_at = 0.0  # each request finds the second between two writes passed
            statuses.append(client.get("/plain").status_code)
    said = [record for record in caplog.records if "could not write the policies declared" in record.getMessage()]
    assert statuses == [200] * 200
    assert len(said) == 1, len(said)  # was 200: one line per retry, 60 a minute per worker


@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
def test_an_error_whose_text_cannot_be_made_is_kept_from_the_site_too(site, settings, fail_open):
    # recording the fault made its text; an error whose __str__ raises escaped the boundary as a 500
    settings.RATELIMIT_FAIL_OPEN = fail_open
    _policy(name="everything", action="*", key="tests.faults.review_boundary_site.unprintable_key")
    assert _statuses(["/plain", "/decorated", "/drf"]) == [200 if fail_open else 503] * 3
    assert boundary.faults.counts.get("tests.faults.review_boundary_site.Unprintable")


def test_saved_quota_usage_that_cannot_be_read_is_logged_once_a_minute_not_per_client(site, caplog):
    # a calendar quota's first request of each client in a period reads its saved usage: with the database
    # away, one log line per new client
    _policy(name="monthly", action="/plain", strategy="calendar_quota", period="month", time_zone="UTC", window=1,
            key="header:x-client")
    client = Client()
    assert client.get("/plain", HTTP_X_CLIENT="first").status_code == 200  # the policies are loaded
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    with _renamed("ratelimit_app_quotausage"):
        statuses = [client.get("/plain", HTTP_X_CLIENT=f"client-{n}").status_code for n in range(200)]
    said = [record for record in caplog.records if "saved usage of a quota could not be read" in record.getMessage()]
    assert statuses == [200] * 200
    assert len(said) == 1, len(said)  # was 200


def _broken_receiver(**kwargs):
    raise RuntimeError("the site's receiver is broken")


def test_a_broken_request_denied_receiver_is_logged_once_a_minute_not_per_refusal(site, caplog):
    from ratelimit_app.events import request_denied

    _policy(name="one", action="/plain", limit=1)
    caplog.set_level(logging.ERROR, logger="ratelimit_app")
    request_denied.connect(_broken_receiver)
    try:
        statuses = _statuses(["/plain"], times=200)
    finally:
        request_denied.disconnect(_broken_receiver)
    said = [record for record in caplog.records if "a receiver of request_denied failed" in record.getMessage()]
    assert statuses == [200] + [429] * 199
    assert len(said) == 1, len(said)  # was 199, each with its traceback


def test_a_request_that_meets_a_fault_counts_once(site):
    # each door that met it counted it again: 2 through the middleware and @ratelimit or a DRF throttle,
    # 3 through a compat throttle, in ratelimit_faults_total
    _policy(name="everything", action="*")
    with _renamed("ratelimit_app_policy"):
        policies.forget_index()
        for path in ["/plain", "/decorated", "/drf", "/compat/drf", "/compat/decorated"]:
            before = sum(boundary.faults.counts.values())
            assert _statuses([path]) == [200]
            assert sum(boundary.faults.counts.values()) - before == 1, path


def test_reset_forgets_what_the_log_said_of_the_faults(site, caplog):
    # testing.reset() promises a process that remembers nothing, the logs included: a test after one that
    # met the same fault must see it logged, and counted from zero
    _policy(name="everything", action="*", key=BROKEN_KEY)
    caplog.set_level(logging.ERROR, logger="ratelimit_app")
    assert _statuses(["/plain"]) == [200]
    testing.reset()
    assert boundary.faults.counts == {}
    assert _statuses(["/plain"]) == [200]
    said = [record for record in caplog.records if "the key function is broken" in record.getMessage()]
    assert len(said) == 2, len(said)


def test_the_compat_doors_on_gunicorn_workers_whose_database_is_away_from_the_start(tmp_path):
    # three workers, none of which ever reached the database: no 500, at any door
    database_url = f"postgres://postgres@127.0.0.1:{_closed_port()}/away"
    with servers.serving(tmp_path / "unused.sqlite3", "tests.faults.review_boundary_settings", workers=3,
                         DATABASE_URL=database_url) as site:
        statuses = [servers.fetch(site.url + path)[0] for path in ["/plain", *COMPAT, "/drf"] for _ in range(10)]
    assert statuses.count(500) == 0, statuses


POLICY_ON_PLAIN = """
from ratelimit_app.models import Policy
Policy.objects.create(name="plain", action="/plain", limit=3, window=60, strategy="fixed_window", key="ip")
"""


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(dbname="postgres", user="postgres", host="127.0.0.1", port=5432, autocommit=True) as admin:
        admin.execute(sql)


def test_gunicorn_workers_that_start_while_postgresql_refuses_them_enforce_the_policies_once_it_is_back(tmp_path):
    # a real outage of PostgreSQL for the site's database (connections refused) at the workers' first
    # requests: no 500, requests pass (fail open), a few log lines; then the database is back and every
    # worker reads the policies again by itself, within about a second
    import time
    import uuid

    name = f"hostile_{uuid.uuid4().hex[:10]}"
    url = f"postgres://postgres@127.0.0.1:5432/{name}"
    _pg_admin(f'CREATE DATABASE "{name}"')
    try:
        env = servers.site_env(tmp_path / "unused", DJANGO_SETTINGS_MODULE="tests.faults.review_boundary_settings",
                               DATABASE_URL=url)
        servers.manage(env, "migrate", "--noinput")
        servers.manage(env, "shell", "-c", POLICY_ON_PLAIN)
        _pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        _pg_admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
        log = tmp_path / "site.log"
        with servers.serving(tmp_path / "unused", "tests.faults.review_boundary_settings", workers=3, log=log,
                             DATABASE_URL=url) as site:
            away = [servers.fetch(site.url + path)[0] for path in ["/plain", *COMPAT, "/drf", "/decorated"] * 40]
            _pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            back, refused_in_a_row = [], 0
            while refused_in_a_row < 10 and len(back) < 1000:
                back.append(servers.fetch(site.url + "/plain")[0])
                refused_in_a_row = refused_in_a_row + 1 if back[-1] == 429 else 0
                time.sleep(0.01)
        said = [line for line in log.read_text().splitlines() if line.startswith("ratelimit")]
    finally:
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"away: {len(away)} requests, {away.count(500)} x 500, {len(said)} log lines; back: {len(back)} requests "
          f"until 10 refusals in a row")
    assert away.count(500) == 0 and set(away) == {200}, away
    assert refused_in_a_row == 10, back[-20:]  # every worker enforces the policy again
    assert len(said) <= 3 * 4, said  # each worker says each kind once, not per request
