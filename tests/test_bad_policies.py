"""Rows that bypass validation (raw SQL, old data) are skipped with a logged error and a system
check warning; every other policy keeps working and no request fails."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.utils import timezone

from ratelimit_app.models import Policy
from ratelimit_app.policies import get_index
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

BAD_ROWS = [
    ("zero-limit", "demo:search", 0, 60, "fixed_window", "ip", None),
    ("zero-window", "demo:search", 5, 0, "fixed_window", "ip", None),
    ("unknown-strategy", "demo:search", 5, 60, "leaky_bucket", "ip", None),
    ("bad-key", "demo:search", 5, 60, "fixed_window", "usr,", None),
    ("bad-bucket", "demo:search", 5, 60, "sliding_window", "ip", 7),
]


def insert_raw(name, action, limit, window, strategy, key, bucket_size):
    table = connection.ops.quote_name(Policy._meta.db_table)
    columns = ", ".join(
        connection.ops.quote_name(c)
        for c in ("name", "action", "limit", "window", "strategy", "key", "methods", "mode", "enabled",
                  "bucket_size", "description", "generation", "created", "updated")
    )
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, '', 'enforce', %s, %s, '', 0, %s, %s)",
            [name, action, limit, window, strategy, key, True, bucket_size, now, now],
        )


@pytest.fixture
def bad_rows():
    for row in BAD_ROWS:
        insert_raw(*row)


@pytest.fixture
def good_policy():
    return make_policy(name="good", action="demo:search", limit=2, window=60, strategy="sliding_log", key="ip")


def test_each_bad_row_is_skipped_with_one_logged_error(bad_rows, good_policy, caplog):
    index = get_index()
    assert [p.name for p in index.policies] == ["good"]
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "is invalid and is skipped" in r.getMessage()]
    assert sorted(r.getMessage().split("'")[1] for r in errors) == sorted(row[0] for row in BAD_ROWS)


def test_manage_py_check_warns_about_each_bad_row(bad_rows, good_policy):
    warnings = [m for m in run_checks() if m.id == "ratelimit_app.W001"]
    assert len(warnings) == len(BAD_ROWS)
    assert any("zero-limit" in w.msg and "at least 1" in w.msg for w in warnings)


def test_other_policies_keep_working_and_nothing_fails(bad_rows, good_policy, client):
    statuses = [client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert client.get("/").status_code == 200
