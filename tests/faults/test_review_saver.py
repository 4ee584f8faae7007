"""The quota usage saver through a real database outage: the worker's own timer thread, whose connections fail
while the database cannot be reached (a closed port on PostgreSQL, a path that is no database on SQLite), then
answer again. What it could not save is kept and saved on its timer once the database answers, once."""

from __future__ import annotations

import contextlib
import logging
import socket
import time

import pytest
from django.db import connections

from ratelimit_app import engine, quotas
from ratelimit_app.models import QuotaUsage
from ratelimit_app.policies import compile_policy
from tests.cluster import wait_for
from tests.helpers import check, make_policy

pytestmark = pytest.mark.django_db(transaction=True)
REFUSED = "quota usage could not be saved yet"


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


def _refusals(caplog) -> int:
    return sum(REFUSED in record.getMessage() for record in caplog.records)


def test_usage_the_database_refused_is_saved_on_the_timer_once_it_answers_again(settings, tmp_path, caplog):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 0.1
    limited = monthly()
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    with database_unreachable(tmp_path):
        assert all(engine.decide([check(limited, f"ip:10.0.0.{n}")]).allowed for n in range(5))
        wait_for(lambda: _refusals(caplog) >= 1, 10, "the saver to fail")  # it tried, on its timer, and failed
    # nothing is decided after the database is back: only the saver's own timer can save the 5 subjects' usage
    try:
        wait_for(lambda: QuotaUsage.objects.count() == 5, 10, "the 5 subjects' usage to be saved")
    finally:
        print(f"after the outage: {QuotaUsage.objects.count()} of 5 rows saved")  # was 0
    assert sorted(QuotaUsage.objects.values_list("used", flat=True)) == [1] * 5


def test_a_batch_saved_after_an_outage_is_not_saved_again(settings, tmp_path, caplog):
    """Once the kept batch is saved, later saves write none of its rows again (each row keeps its `updated`)."""
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 0.1
    limited = monthly()
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    with database_unreachable(tmp_path):
        assert all(engine.decide([check(limited, f"ip:10.0.1.{n}")]).allowed for n in range(3))
        wait_for(lambda: _refusals(caplog) >= 1, 10, "the saver to fail")
    wait_for(lambda: QuotaUsage.objects.count() == 3, 10, "the 3 subjects' usage to be saved")
    written = dict(QuotaUsage.objects.values_list("subject", "updated"))
    assert engine.decide([check(limited, "ip:10.0.2.1")]).allowed  # another subject: the next save is its alone
    wait_for(lambda: QuotaUsage.objects.count() == 4, 10, "the 4th subject's usage to be saved")
    assert dict(QuotaUsage.objects.filter(subject__in=written).values_list("subject", "updated")) == written
    assert quotas.saver.save() == 0  # nothing left pending


def test_a_save_the_database_refuses_half_way_saves_none_of_its_rows(monkeypatch):
    """Two INSERTs of 2 rows; the database refuses the second (a count beyond its column): neither is saved, so
    that the batch kept and saved again later writes no row twice."""
    monkeypatch.setattr(quotas, "BATCH", 2)
    limited = monthly()
    start = quotas.periods(limited, int(time.time() * 1000)).start
    for n, used in enumerate([1, 2, 3, 2**63]):  # 2**63: more than a PositiveBigIntegerField holds
        quotas.saver.record(limited, f"subject-{n}", f"ip:10.0.3.{n}", start, used)
    try:
        assert quotas.saver.save() == 0
        assert QuotaUsage.objects.count() == 0  # was 2: the first INSERT stayed
    finally:
        quotas.saver.discard()
