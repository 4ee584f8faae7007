"""A policy created, edited, disabled or deleted elsewhere is obeyed by every worker within a second."""

from __future__ import annotations

import time

import pytest

from tests.servers import Server, fetch, manage, site_env

pytestmark = pytest.mark.slow
CONTRACT_SECONDS = 1.0
SLACK = 0.5  # a request's own latency on a loaded 2-core machine


@pytest.fixture
def workers(tmp_path):
    env = site_env(tmp_path / "site.sqlite3")
    manage(env, "migrate", "--noinput")
    servers = [Server(env), Server(env)]
    try:
        yield env, servers
    finally:
        for server in servers:
            server.stop()


def seconds_until(condition, servers, timeout=10.0) -> float:
    """Poll every server until `condition(status, headers)` holds on all; the time it took."""
    started = time.monotonic()
    pending = list(servers)
    while pending and time.monotonic() - started < timeout:
        pending = [s for s in pending if not condition(*fetch(s.url + "/demo/search/?q=a", **{"X-Forwarded-For": "x"}))]
        time.sleep(0.02)
    assert not pending, "a worker never obeyed the change"
    return time.monotonic() - started


def shell(env, code: str) -> None:
    manage(env, "shell", "-c", "from ratelimit_app.models import Policy\n" + code)


def test_changes_reach_every_worker_within_a_second(workers):
    env, servers = workers
    for server in servers:  # both workers have loaded their (empty) index
        assert "RateLimit" not in fetch(server.url + "/demo/search/")[1]

    shell(env, "Policy.objects.create(name='search', action='demo:search', limit=1000, window=60, strategy='fixed_window', key='global')")
    created = seconds_until(lambda status, headers: "RateLimit" in headers, servers)

    shell(env, "p = Policy.objects.get(name='search'); p.limit = 1; p.save()")
    edited = seconds_until(lambda status, headers: status == 429, servers)

    shell(env, "p = Policy.objects.get(name='search'); p.enabled = False; p.save()")
    disabled = seconds_until(lambda status, headers: status == 200 and "RateLimit" not in headers, servers)

    shell(env, "p = Policy.objects.get(name='search'); p.enabled = True; p.save()")
    seconds_until(lambda status, headers: status == 429, servers)

    shell(env, "from ratelimit_app.models import Override\n"
               "Override.objects.create(policy=Policy.objects.get(name='search'), kind='ip', network='127.0.0.1', limit=100000)")
    overridden = seconds_until(lambda status, headers: status == 200 and '"search";q=100000' in headers.get("RateLimit-Policy", ""), servers)
    shell(env, "Policy.objects.get(name='search').delete()")
    deleted = seconds_until(lambda status, headers: status == 200 and "RateLimit" not in headers, servers)

    print(f"\npropagation seconds: created {created:.2f}, edited {edited:.2f}, disabled {disabled:.2f}, "
          f"override {overridden:.2f}, deleted {deleted:.2f}")
    assert max(created, edited, disabled, overridden, deleted) <= CONTRACT_SECONDS + SLACK
