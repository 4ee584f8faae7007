"""The quota usage saver through a real database outage: the worker's own timer thread, whose connections fail
while the database cannot be reached (a closed port on PostgreSQL, a path that is no database on SQLite), then
answer again. What it could not save is kept and saved on its timer once the database answers, once."""

from __future__ import annotations

import contextlib
import logging
import socket
import time

import pytest
from django.db import OperationalError, connections

from ratelimit_app import engine, quotas
from ratelimit_app.models import QuotaUsage
from ratelimit_app.policies import compile_policy
from tests import servers
from tests.cluster import wait_for
from tests.faults.test_review_doors import status
from tests.faults.test_review_quotas_servers import SETTINGS, saved_usage
from tests.helpers import check, make_policy
from tests.servers import migrated_site

pytestmark = pytest.mark.django_db(transaction=True)
REFUSED = "quota usage could not be saved yet"
POLICIES = """
from ratelimit_app.models import Policy
Policy.objects.create(name="month", action="/month/", limit=1000, window=2678400, strategy="calendar_quota",
                      period="month", time_zone="UTC", key="ip")
"""


def monthly(limit: int = 100):
    return compile_policy(make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC",
                                      limit=limit, window=1))


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        return listening.getsockname()[1]  # closed on leaving: nothing listens there


@contextlib.contextmanager
def database_unreachable(tmp_path):
    """New connections of this process fail until the block ends (a closed port on PostgreSQL; on SQLite a path
    that is a directory, which SQLite cannot open); the saver's thread opens a new one for each save."""
    settings_dict = connections["default"].settings_dict  # the dict every thread's connection is made from
    kept = dict(settings_dict)
    if connections["default"].vendor == "sqlite":
        settings_dict["NAME"] = str(tmp_path)
    else:
        settings_dict.update(HOST="127.0.0.1", PORT=_closed_port())
    try:
        yield
    finally:
        settings_dict.clear()
        settings_dict.update(kept)


def _quiet(read):
    """`read()`, or None while the saver's thread holds the table: SQLite's shared in-memory test database
    refuses a read at once then, where a database file would wait for the write to end."""
    try:
        return read()
    except OperationalError:
        return None


def _rows(count: int) -> bool:
    return _quiet(QuotaUsage.objects.count) == count


def _refusals(caplog) -> int:
    return sum(REFUSED in record.getMessage() for record in caplog.records)


def _after_the_last_count(refusals) -> None:
    """Two saves refused since the last count: the first may have begun before it, the second began after it,
    so no save started by a count is left to find the database back."""
    seen = refusals()
    wait_for(lambda: refusals() >= seen + 2, 10, "two saves refused after the last count")


def test_usage_the_database_refused_is_saved_on_the_timer_once_it_answers_again(settings, tmp_path, caplog):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 0.1
    limited = monthly()
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    with database_unreachable(tmp_path):
        assert all(engine.decide([check(limited, f"ip:10.0.0.{n}")]).allowed for n in range(5))
        _after_the_last_count(lambda: _refusals(caplog))
    # nothing is decided after the database is back: only the saver's own timer can save the 5 subjects' usage
    try:
        wait_for(lambda: _rows(5), 10, "the 5 subjects' usage to be saved")
    finally:
        print(f"after the outage: {_quiet(QuotaUsage.objects.count)} of 5 rows saved")  # was 0
    assert wait_for(lambda: _quiet(lambda: sorted(QuotaUsage.objects.values_list("used", flat=True))), 10,
                    "the rows") == [1] * 5


def test_a_batch_saved_after_an_outage_is_not_saved_again(settings, tmp_path, caplog):
    """Once the kept batch is saved, later saves write none of its rows again (each row keeps its `updated`)."""
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 0.1
    limited = monthly()
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    with database_unreachable(tmp_path):
        assert all(engine.decide([check(limited, f"ip:10.0.1.{n}")]).allowed for n in range(3))
        _after_the_last_count(lambda: _refusals(caplog))
    wait_for(lambda: _rows(3), 10, "the 3 subjects' usage to be saved")
    written = wait_for(lambda: _quiet(lambda: dict(QuotaUsage.objects.values_list("subject", "updated"))), 10, "rows")
    assert engine.decide([check(limited, "ip:10.0.2.1")]).allowed  # another subject: the next save is its alone
    wait_for(lambda: _rows(4), 10, "the 4th subject's usage to be saved")
    again = wait_for(lambda: _quiet(lambda: dict(QuotaUsage.objects.filter(subject__in=written)
                                                 .values_list("subject", "updated"))), 10, "rows")
    assert again == written
    assert quotas.saver.save() == 0  # nothing left pending


def test_a_save_the_database_refuses_half_way_saves_none_of_its_rows(monkeypatch):
    """Two INSERTs of 2 rows; the database refuses the second (a count beyond its column): neither is saved, so
    that the batch kept and saved again later writes no row twice."""
    monkeypatch.setattr(quotas, "BATCH", 2)
    limited = monthly()
    start = limited.plugin.span(limited, int(time.time() * 1000))[0]  # the period now, as the strategy says it
    for n, used in enumerate([1, 2, 3, 2**63]):  # 2**63: more than a PositiveBigIntegerField holds
        quotas.saver.record(limited, f"subject-{n}", f"ip:10.0.3.{n}", start, used)
    try:
        assert quotas.saver.save() == 0
        assert QuotaUsage.objects.count() == 0  # was 2: the first INSERT stayed
    finally:
        quotas.saver.discard()


# --- on a real server ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_gunicorn_workers_save_what_they_counted_while_the_database_was_away(tmp_path):
    """The site's SQLite file moves away and a directory takes its place (the worker's saver cannot open it;
    its requests go on with the connection they hold), then it comes back. No request after that: the
    worker's own timer saves the 40 requests counted meanwhile. One worker, warmed by a request first: a worker
    whose first request finds no database answers 500 (its policies cannot be loaded), another matter."""
    database = migrated_site(tmp_path, SETTINGS, POLICIES)
    log = tmp_path / "server.log"
    away = tmp_path / "away.sqlite3"
    with servers.serving(database, SETTINGS, workers=1, log=log) as server:
        assert status(server.url + "/month/")[0] == 200
        wait_for(lambda: saved_usage(database) == 1, 10, "the first request's usage to be saved")
        database.rename(away)
        database.mkdir()
        try:
            assert [status(server.url + "/month/")[0] for _ in range(40)] == [200] * 40
            _after_the_last_count(lambda: log.read_text().count(REFUSED))
        finally:
            database.rmdir()
            away.rename(database)
        try:
            wait_for(lambda: saved_usage(database) == 41, 10, "the 40 requests' usage to be saved")
        finally:
            print(f"gunicorn: {saved_usage(database) - 1} of 40 saved after the database came back")  # was 0
