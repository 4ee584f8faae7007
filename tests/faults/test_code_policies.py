"""Faults around policies declared in code: fresh workers starting together on an empty table (every
one must enforce every code policy from its first request, whoever wins the insert), one view routed
twice, and `migrate` / `check` on a fresh database of a project that declares costs."""

from __future__ import annotations

import pytest

from .fresh import fresh_database, fresh_workers, manage, site_env

pytestmark = pytest.mark.slow


@pytest.fixture
def site(tmp_path):
    """A migrated, empty database (no policy row yet) shared by the processes of one scenario."""
    with fresh_database(tmp_path) as url:
        env = site_env(url, RATELIMIT_KEY_PREFIX=f"fault{tmp_path.name[-6:]}")
        migrated = manage(env, "migrate", "--noinput")
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        manage(env, "shell", "-c", "from ratelimit_app.models import Policy; Policy.objects.all().delete()")
        yield env


def admitted(workers) -> int:
    return sum(status == 200 for worker in workers for status in worker.statuses)


def complaints(workers) -> list[str]:
    """What the workers logged about writing the policies (a lost insert race is no error)."""
    return [line for worker in workers for line in worker.log.splitlines() if "ratelimit" in line or "Traceback" in line]


def test_fresh_workers_enforce_a_code_policy_from_their_first_request(site):
    workers = fresh_workers(site, "/limited/", requests=20)  # rate="50/5m", key="global"
    assert complaints(workers) == []
    assert {status for worker in workers for status in worker.statuses} <= {200, 429}
    assert admitted(workers) == 50


def test_fresh_workers_count_every_unit_of_a_code_cost(site):
    workers = fresh_workers(site, "/costly/", requests=100)  # rate="300/5m", cost=3
    assert complaints(workers) == []
    assert admitted(workers) == 100
