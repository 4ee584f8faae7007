"""Prometheus metrics: decisions per policy and outcome, Redis latency, breaker, outage and deny cache;
the /metrics exposition, gunicorn's multiprocess mode, and an app that works without prometheus_client."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from ratelimit_app import engine, events, metrics
from tests.helpers import check, make_policy, policy
from tests.servers import ROOT, Server, fetch, manage, site_env


def decisions(policy_name: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("ratelimit_decisions_total", {"policy": policy_name, "outcome": outcome}) or 0


def sample(name: str, labels: dict | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


# --- decisions ---------------------------------------------------------------------------------


def test_decisions_are_counted_per_policy_and_outcome():
    search = policy(limit=2)
    for _ in range(3):
        metrics.record_verdict(engine.decide([check(search)]))
    assert decisions(search.name, "allowed") == 2
    assert decisions(search.name, "denied") == 1


def test_a_shadow_policy_over_its_limit_counts_as_shadow_denied():
    watched = policy(limit=1, mode="shadow")
    for _ in range(3):
        metrics.record_verdict(engine.decide([check(watched)]))
    assert (decisions(watched.name, "allowed"), decisions(watched.name, "shadow_denied")) == (1, 2)
    assert decisions(watched.name, "denied") == 0


def test_a_policy_that_admitted_a_request_another_denied_counted_nothing():
    strict, generous = policy(limit=1), policy(limit=100)
    for _ in range(3):
        metrics.record_verdict(engine.decide([check(strict), check(generous)]))
    assert (decisions(strict.name, "allowed"), decisions(strict.name, "denied")) == (1, 2)
    assert (decisions(generous.name, "allowed"), decisions(generous.name, "denied")) == (1, 0)  # as the live page's totals


def test_the_other_hooks_count_what_they_name():
    exempted = policy()
    metrics.record_exempt(exempted)
    metrics.deny_cache_hit(exempted)
    metrics.deny_cache_hit(exempted)
    before = (sample("ratelimit_redis_call_duration_seconds_count"), sample("ratelimit_outage_requests_total", {"outcome": "refused"}),
              sample("ratelimit_breaker_openings_total"))
    metrics.record_call(0.0003)
    metrics.record_outage(allowed=False)
    metrics.breaker_opened()
    assert sample("ratelimit_breaker_open") == 1
    metrics.breaker_closed()
    assert decisions(exempted.name, "exempt") == 1
    assert sample("ratelimit_deny_cache_hits_total", {"policy": exempted.name}) == 2
    after = (sample("ratelimit_redis_call_duration_seconds_count"), sample("ratelimit_outage_requests_total", {"outcome": "refused"}),
             sample("ratelimit_breaker_openings_total"))
    assert [b - a for a, b in zip(before, after)] == [1, 1, 1]
    assert sample("ratelimit_breaker_open") == 0


def test_metrics_switched_off_record_nothing(settings):
    quiet = policy(limit=1)
    settings.RATELIMIT_METRICS = False
    assert not metrics.enabled()
    for _ in range(2):
        metrics.record_verdict(engine.decide([check(quiet)]))
    metrics.deny_cache_hit(quiet)
    assert decisions(quiet.name, "allowed") == decisions(quiet.name, "denied") == 0
    assert sample("ratelimit_deny_cache_hits_total", {"policy": quiet.name}) == 0
    settings.RATELIMIT_METRICS = None
    assert metrics.enabled()  # on by default when prometheus_client is installed


# --- exposition --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_url_serves_the_prometheus_text_format(client):
    shown = policy(limit=1, name="shown-policy")
    for _ in range(2):
        metrics.record_verdict(engine.decide([check(shown)]))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")  # the format Prometheus scrapes
    found = families(response.content.decode())
    assert found["ratelimit_decisions"].type == "counter"
    assert found["ratelimit_redis_call_duration_seconds"].type == "histogram"
    assert found["ratelimit_breaker_open"].type == "gauge"
    assert {"ratelimit_breaker_openings", "ratelimit_outage_requests", "ratelimit_deny_cache_hits"} <= set(found)
    samples = {(s.name, s.labels.get("outcome")): s.value for s in found["ratelimit_decisions"].samples
               if s.labels.get("policy") == "shown-policy"}
    assert samples == {("ratelimit_decisions_total", "allowed"): 1, ("ratelimit_decisions_total", "denied"): 1}


def _run(database: Path, code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=site_env(database, **env),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_prometheus_client_the_app_works_and_the_url_says_what_is_missing(tmp_path):
    output = _run(tmp_path / "db.sqlite3", """
        import sys
        sys.modules["prometheus_client"] = None  # as if it were not installed: importing it fails
        import django
        django.setup()
        import ratelimit_app.admin, ratelimit_app.events, ratelimit_app.limiter, ratelimit_app.middleware
        from django.test import RequestFactory
        from ratelimit_app import metrics
        metrics.record_call(0.001)
        metrics.breaker_opened()
        response = metrics.metrics_view(RequestFactory().get("/metrics"))
        print(metrics.enabled(), response.status_code, response.content.decode().strip())
        from django.core.checks import run_checks
        from django.test.utils import override_settings
        override_settings(RATELIMIT_METRICS=True).enable()  # asked for explicitly: `manage.py check` says it cannot be
        print([message.id for message in run_checks() if message.id.startswith("ratelimit_app.W005")])
    """)
    assert output.splitlines() == [
        "False 501 prometheus_client is not installed: pip install prometheus_client", "['ratelimit_app.W005']",
    ]


def test_gunicorn_multiprocess_mode_adds_up_every_worker(tmp_path, monkeypatch):
    """Each worker writes its own files in PROMETHEUS_MULTIPROC_DIR; the exposition adds them up."""
    worker = """
        import django
        django.setup()
        from ratelimit_app import engine, events, metrics
        from tests.helpers import check, policy
        search = policy(limit=3, name="search-everywhere")
        for _ in range(4):
            metrics.record_verdict(engine.decide([check(search, "ip:198.51.100.{n}")]))
        if {n} == 1:
            metrics.breaker_opened()
    """
    shared = tmp_path / "metrics"
    shared.mkdir()
    for n in (1, 2):  # two processes, like two gunicorn workers
        _run(tmp_path / "db.sqlite3", worker.format(n=n), PROMETHEUS_MULTIPROC_DIR=str(shared))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    body, _ = metrics.exposition()
    found = families(body.decode())
    outcomes = {s.labels["outcome"]: s.value for s in found["ratelimit_decisions"].samples
                if s.name == "ratelimit_decisions_total" and s.labels["policy"] == "search-everywhere"}
    assert outcomes == {"allowed": 6, "denied": 2}
    assert [s.value for s in found["ratelimit_breaker_open"].samples] == [1]  # open in one worker: open
    assert [s.value for s in found["ratelimit_breaker_openings"].samples if s.name.endswith("_total")] == [1]


# --- through the doors (needs the wiring) -------------------------------------------------------


@pytest.fixture
def own_outage_log(monkeypatch):
    """An outage of this test's own: the once-per-second outage warning of the tests after it still shows."""
    from ratelimit_app import limiter

    monkeypatch.setattr(limiter, "outage", events.Outage())


@pytest.mark.django_db
def test_requests_through_the_demo_show_in_the_metrics(client):
    make_policy(name="search-metered", action="demo:search", limit=2, key="ip")
    calls = sample("ratelimit_redis_call_duration_seconds_count")
    statuses = [client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert (decisions("search-metered", "allowed"), decisions("search-metered", "denied")) == (2, 1)
    assert sample("ratelimit_redis_call_duration_seconds_count") > calls


@pytest.mark.django_db
def test_exempt_subjects_are_counted_as_exempt(client):
    from ratelimit_app.models import Override

    exempting = make_policy(name="search-exempting", action="demo:search", limit=1, key="ip")
    Override.objects.create(policy=exempting, kind="ip", network="203.0.113.0/24", exempt=True, reason="office")
    assert [client.get("/demo/search/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(2)] == [200, 200]
    assert decisions("search-exempting", "exempt") == 2


@pytest.mark.django_db
def test_requests_let_through_while_redis_is_down_are_counted(client, settings, own_outage_log):
    make_policy(name="search-outage", action="demo:search", limit=2, key="ip")
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    events.breaker_closed()  # Redis known to be available, whatever an earlier test left
    before = sample("ratelimit_outage_requests_total", {"outcome": "allowed"})
    assert client.get("/demo/search/", REMOTE_ADDR="203.0.113.7").status_code == 200
    assert sample("ratelimit_outage_requests_total", {"outcome": "allowed"}) == before + 1
    assert sample("ratelimit_breaker_open") == 1


@pytest.mark.slow
def test_gunicorn_workers_requests_add_up_at_the_metrics_url(tmp_path):
    shared = tmp_path / "metrics"
    shared.mkdir()
    env = site_env(tmp_path / "metrics.sqlite3", PROMETHEUS_MULTIPROC_DIR=str(shared))
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", "from ratelimit_app.models import Policy\n"
           "Policy.objects.create(name='metered', action='demo:search', limit=5, window=60, key='ip')")
    server = Server(env, workers=2)
    try:
        statuses = [fetch(server.url + "/demo/search/?q=a")[0] for _ in range(12)]
        # the worker that serves the scrape folds its own counts; the other's reach the files within a second
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(server.url + "/metrics", timeout=5) as response:
                found = families(response.read().decode())
            outcomes = {s.labels["outcome"]: s.value for s in found["ratelimit_decisions"].samples
                        if s.name == "ratelimit_decisions_total" and s.labels["policy"] == "metered"}
            if sum(outcomes.values()) >= 12 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        server.stop()
    assert statuses.count(200) == 5
    assert outcomes == {"allowed": 5, "denied": 7}
