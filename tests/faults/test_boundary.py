"""The fault matrix: every door of the limiter x every I/O point it has x sync and async, each fault made
real (a table the database cannot read, writes it refuses, a Redis that is not there or stops under
the request, a setting of the wrong type), under fail open and fail closed. No cell answers 500: the
request follows RATELIMIT_FAIL_OPEN, or goes on untouched where the fault is off its way.

A door declared in ratelimit_app.boundary, or an I/O point listed there, without its row here fails
test_every_door_and_io_point_has_its_row; a module that starts reading or writing the database or
Redis fails test_every_module_that_reads_or_writes_has_its_io_point until it names its point."""

from __future__ import annotations

import contextlib
import re
import socket
from pathlib import Path

import pytest
from django.db import connection
from django.test import AsyncClient, Client

import ratelimit_app
from ratelimit_app import boundary
from ratelimit_app.engine.tally import tally
from ratelimit_app.events import outage
from ratelimit_app.models import Policy
from ratelimit_app.quotas import saver
from tests.faults import matrix_site

pytestmark = [pytest.mark.django_db(transaction=True)]

MIDDLEWARE = "ratelimit_app.middleware.RateLimitMiddleware"

# door -> the action of its policy ('' : the middleware's path prefix)
DOORS = {
    "middleware": "/door/middleware/",
    "decorator": "door-decorator",
    "drf": "door-drf",
    "hit": "door-hit",
    "check": "door-check",
    "usage": "door-usage",
    "live": "/door/live/",
}

# I/O point -> (strategy its policy needs, whether the fault keeps the limiter from deciding)
POINTS = {
    "policies": ("fixed_window", True),
    "overrides": ("fixed_window", True),
    "plans": ("fixed_window", True),
    "code_sync": ("fixed_window", False),  # declared policies are enforced without their rows meanwhile
    "saved_usage": ("calendar_quota", False),  # decided from what Redis holds; the read is logged
    "usage_saver": ("calendar_quota", False),
    "decision": ("fixed_window", True),
    "give_back": ("concurrency", False),
    "tally": ("fixed_window", False),
    "clock": ("fixed_window", False),
    "live_reads": ("fixed_window", True),
    "setting": ("fixed_window", False),  # read as its default, with a logged error (system check E021)
}


def test_every_door_and_io_point_has_its_row():
    assert set(DOORS) == set(boundary.Door.declared)
    assert set(POINTS) == set(boundary.IO_POINTS)
    assert set(INJECT) == set(POINTS)


# --- the faults, made real ---------------------------------------------------------------------


@contextlib.contextmanager
def _renamed(table: str):
    """The table cannot be read or written: every query of it fails in the database itself."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_away RENAME TO {table}")


@contextlib.contextmanager
def _writes_refused(table: str):
    """The database refuses every insert into `table` (a trigger), reads still work."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"CREATE TRIGGER refuse_writes BEFORE INSERT ON {table} "
                           "BEGIN SELECT RAISE(ABORT, 'writes refused'); END")
        else:
            cursor.execute("CREATE OR REPLACE FUNCTION refuse_writes() RETURNS trigger AS $$ "
                           "BEGIN RAISE EXCEPTION 'writes refused'; END $$ LANGUAGE plpgsql")
            cursor.execute(f"CREATE TRIGGER refuse_writes BEFORE INSERT ON {table} "
                           "FOR EACH ROW EXECUTE FUNCTION refuse_writes()")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("DROP TRIGGER refuse_writes")
            else:
                cursor.execute(f"DROP TRIGGER refuse_writes ON {table}")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe is closed


@contextlib.contextmanager
def _redis_away(settings):
    settings.CACHES = {**settings.CACHES, "away": {**settings.CACHES["default"],
                                                   "LOCATION": f"redis://127.0.0.1:{_closed_port()}/0"}}
    settings.RATELIMIT_CACHE = "away"
    yield


class Cell:
    """What a fault needs around one request: the test's settings, a Redis of its own, a warm-up."""

    def __init__(self, settings, server, request) -> None:
        self.settings, self.server, self.request = settings, server, request
        self.after = []  # what runs after the request (a background step meeting the fault)


@contextlib.contextmanager
def inject_policies(cell):
    with _renamed("ratelimit_app_policy"):
        yield


@contextlib.contextmanager
def inject_overrides(cell):
    with _renamed("ratelimit_app_override"):
        yield


@contextlib.contextmanager
def inject_plans(cell):
    with _renamed("ratelimit_app_planassignment"):
        yield


@contextlib.contextmanager
def inject_code_sync(cell):
    # a policy declared in settings, not written yet: its row is written before the index loads
    cell.settings.RATELIMIT_POLICIES = [{"name": "declared-here", "action": "/nowhere/", "rate": "5/m", "key": "ip"}]
    with _writes_refused("ratelimit_app_policy"):
        yield


@contextlib.contextmanager
def inject_saved_usage(cell):
    with _renamed("ratelimit_app_quotausage"):  # the quota has no counter in Redis: its saved usage is read
        yield


@contextlib.contextmanager
def inject_usage_saver(cell):
    cell.request()  # the period's counter exists in Redis: the request needs no saved usage
    cell.after.append(lambda: saver.save())
    with _renamed("ratelimit_app_quotausage"):
        yield


@contextlib.contextmanager
def inject_decision(cell):
    with _redis_away(cell.settings):
        yield


@contextlib.contextmanager
def inject_give_back(cell):
    matrix_site.during_view.append(cell.server.stop)  # the places taken are given back to a Redis gone
    yield


@contextlib.contextmanager
def inject_tally(cell):
    cell.after.append(cell.server.stop)
    cell.after.append(tally.flush)  # the totals' flush meets a Redis gone
    yield


@contextlib.contextmanager
def inject_clock(cell):
    cell.after.append(cell.server.stop)
    cell.after.append(lambda: tally._heartbeat())  # reads Redis's clock again: from a Redis gone
    tally._heartbeat_due = 0.0
    yield


@contextlib.contextmanager
def inject_live_reads(cell):
    with _redis_away(cell.settings):
        yield


@contextlib.contextmanager
def inject_setting(cell):
    cell.settings.RATELIMIT_IPV4_PREFIX = "thirty-two"
    yield


INJECT = {name[len("inject_"):]: value for name, value in globals().items() if name.startswith("inject_")}


# --- the cells ---------------------------------------------------------------------------------


@pytest.fixture
def site(settings):
    settings.ROOT_URLCONF = "tests.faults.matrix_site"
    matrix_site.during_view.clear()
    yield
    matrix_site.during_view.clear()


def _policy_for(door: str, strategy: str) -> Policy:
    fields = {"name": f"door-{door}", "action": DOORS[door], "limit": 5, "window": 60, "strategy": strategy,
              "key": "ip"}
    if strategy == "calendar_quota":
        fields.update(period="month", time_zone="UTC", window=1)
    row = Policy(**fields)
    row.full_clean()
    row.save()
    return row


def _path(door: str, flavour: str, row: Policy) -> str:
    if door == "live":
        return f"/admin/ratelimit_app/policy/{row.pk}/live/?format=json"
    return f"/door/{door}/{flavour}"


def _observed() -> int:
    return sum(boundary.faults.counts.values()) + outage.requests


def _expected(door: str, point: str, fail_open: bool) -> set[int]:
    strategy, deciding = POINTS[point]
    if door == "live":  # the operator's page: what it cannot read shows as a 503 page with the reason
        return {503} if point in ("policies", "decision", "live_reads") else {200}
    if not deciding:
        return {200}
    if door == "usage":  # usage() cannot say what was used, whatever the rule: never "nothing"
        return {503}
    return {200} if fail_open else {503}


STOPS_REDIS = {"give_back", "tally", "clock"}



@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("door", list(DOORS))
def test_no_fault_of_the_limiter_reaches_the_site(site, settings, request, caplog, door, point, flavour, fail_open):
    settings.RATELIMIT_FAIL_OPEN = fail_open
    # a Redis of the cell's own where the fault stops it; the suite's shared one elsewhere
    server = request.getfixturevalue("server") if point in STOPS_REDIS else None
    if door != "middleware":  # each door alone: the middleware would meet the fault first
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE]
    row = _policy_for(door, POINTS[point][0])
    path = _path(door, flavour, row)
    client = AsyncClient() if flavour == "async" else Client()
    sync_client = Client()
    if door == "live":
        admin_user = request.getfixturevalue("admin_user")
        client.force_login(admin_user)
        sync_client.force_login(admin_user)
    cell = Cell(settings, server, lambda: sync_client.get(path))
    before = _observed()

    with INJECT[point](cell):
        response = client.get(path)
        if flavour == "async":
            response = _awaited(response)
        for step in cell.after:
            step()  # a background step meeting the fault raises nothing either

    assert response.status_code in _expected(door, point, fail_open), response.content[:300]
    if response.status_code == 503:
        assert response.headers.get("Retry-After") or door in ("live", "hit", "check", "usage")
    if point == "setting" and door != "live":  # the page's JSON reads no address
        assert "RATELIMIT_IPV4_PREFIX" in caplog.text and "ratelimit_app.E021" in caplog.text
    if POINTS[point][1] and response.status_code == 200 and door != "live":  # the page's JSON reads no override
        assert _observed() > before  # the fault was met, and recorded (a cell that met nothing proves nothing)


def _awaited(coroutine):
    import asyncio

    return asyncio.run(coroutine)


# --- where the I/O is: a module that starts reading or writing a database or Redis needs its point ---

# module -> the I/O point its reads and writes are (None: the operator's own, never around a request)
IO_MODULES = {
    "engine/aclients.py": "decision",
    "engine/batches.py": "decision",
    "engine/clients.py": "decision",
    "engine/decision.py": "decision",
    "engine/decision_connection.py": "decision",
    "engine/giveback.py": "give_back",
    "engine/reads.py": "saved_usage",  # the counters read as the saver saves them
    "engine/tally.py": "tally",
    "engine/version.py": "policies",  # the policy version, compared when the index loads
    "engine/admin_connection.py": "live_reads",
    "live/activity.py": "live_reads",
    "live/resets.py": "live_reads",
    "live/usage.py": "live_reads",
    "operations.py": "live_reads",
    "loading.py": "policies",  # with the overrides, action costs and plans of the same load
    "quotas.py": "saved_usage",  # and the usage saver's writes
    "registry/rows.py": "code_sync",
    "engine/libraries.py": None,  # `ratelimit prune`
    "models/policy.py": None,  # the admin form's validation
    "subjects/text.py": None,  # a subject as the operator types it (reset, tester)
    "tester.py": None,  # the admin's tester and `ratelimit test`
}
# the operator's side, and users' tests (ratelimit_app.testing): never around a request of the site
OPERATOR_PACKAGES = ("admin/", "management/", "migrations/", "checks/", "portable/", "testing/")
IO_CALLS = re.compile(r"\.objects\b|connections\[|transaction\.atomic|\bclient\(\)|aclient\(|admin_call\(|"
                      r"decision_client\(|get_redis_connection")


def test_every_module_that_reads_or_writes_has_its_io_point():
    package = Path(ratelimit_app.__file__).parent
    found = {
        str(path.relative_to(package)) for path in package.rglob("*.py")
        if not str(path.relative_to(package)).startswith(OPERATOR_PACKAGES) and IO_CALLS.search(path.read_text())
    }
    assert found == set(IO_MODULES)
    assert {point for point in IO_MODULES.values() if point} <= set(POINTS)
