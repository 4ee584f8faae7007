"""Faults around policies declared in code: fresh workers starting together on an empty table (every
one must enforce every code policy from its first request, whoever wins the insert), one view routed
twice, and `migrate` / `check` on a fresh database of a project that declares costs."""

from __future__ import annotations

import json

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



def test_fresh_workers_enforce_the_operators_change_over_the_codes_values(site):
    changed = manage(site, "shell", "-c", (
        "import tests.faults.code_urls; from ratelimit_app import registry; registry.sync(); "
        "from ratelimit_app.models import Policy; Policy.objects.filter(name='tests-faults-code-urls-limited').update(limit=30)"
    ))
    assert changed.returncode == 0, changed.stderr[-3000:]
    workers = fresh_workers(site, "/limited/", requests=20)  # the code says 50/5m, the admin 30
    assert complaints(workers) == []
    assert admitted(workers) == 30

# --- migrate and check on a fresh database --------------------------------------------------------


@pytest.fixture
def empty(tmp_path):
    """A database with no table at all, as a new environment (CI, staging) starts."""
    with fresh_database(tmp_path) as url:
        yield site_env(url)


def no_traceback(done) -> bool:
    return "Traceback" not in done.stderr and "Error:" not in done.stderr.replace("SystemCheckError:", "")


def test_migrate_and_check_a_fresh_database_of_a_project_declaring_code_policies_and_costs(empty):
    checked = manage(empty, "check", "--database", "default")  # before any table exists
    assert (checked.returncode, no_traceback(checked)) == (0, True), checked.stderr[-3000:]
    migrated = manage(empty, "migrate", "--noinput")
    assert (migrated.returncode, no_traceback(migrated)) == (0, True), migrated.stderr[-3000:]
    checked = manage(empty, "check", "--database", "default")
    assert (checked.returncode, no_traceback(checked)) == (0, True), checked.stderr[-3000:]


def test_a_cost_that_never_fits_is_reported_on_a_fresh_database_without_a_traceback(empty):
    tight = [{"name": "tight", "action": "code:tests.faults.code_urls.costly", "rate": "2/m", "key": "ip"}]
    env = {**empty, "FAULT_POLICIES": json.dumps(tight)}
    for command in (("check", "--database", "default"), ("migrate", "--noinput")):
        done = manage(env, *command)
        assert done.returncode == 1
        assert "ratelimit_app.E018" in done.stderr and "costs 3 units, more than policy 'tight' allows at once (2)" in done.stderr
        assert "Traceback" not in done.stderr
