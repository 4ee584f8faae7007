"""The admin's CSV export of quota usage for billing, for a large API: 100,000 subjects in one period,
streamed in bounded memory. The rows are made by the database itself (a recursive query on SQLite,
generate_series on PostgreSQL): as many model instances would take a minute to insert and prove nothing
about the export."""

from __future__ import annotations

import gc
import sys
from datetime import datetime, timezone

import pytest

from ratelimit_app.admin.quota_usage import CHUNK
from ratelimit_app.models import QuotaUsage
from ratelimit_app.periods import periods_at, zone
from ratelimit_app.quotas import as_datetime
from tests.helpers import insert_usage, make_policy

SUBJECTS = 100_000
# objects the export may hold alive at once beyond what it started with: one database fetch of CHUNK
# rows is ~10 per row; the 100,000 rows held at once would be over 700,000, 14 times the bound (a
# million rows, as this test once exported, took ten times the CPU to prove the same)
BLOCKS = 20 * CHUNK + 10_000


@pytest.mark.slow
@pytest.mark.django_db
def test_the_csv_export_of_100000_subjects_streams_in_bounded_memory(admin_client):
    """Every one of the 100,000 rows is exported once, each chunk the response yields is one row,
    and the objects the interpreter holds (sys.getallocatedblocks, read every 100 rows: tracemalloc
    would make the export ten times slower) never grow by more than a few database fetches' worth."""
    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=1000, window=1)
    start = periods_at("month", zone("UTC"), int(datetime.now(timezone.utc).timestamp() * 1000)).start
    insert_usage(row.pk, as_datetime(start), SUBJECTS)
    assert QuotaUsage.objects.count() == SUBJECTS

    answer = admin_client.get("/admin/ratelimit_app/quotausage/export.csv?period=current")
    assert answer.status_code == 200 and answer.streaming
    lines = size = largest = total_used = 0
    gc.collect()
    before = most = sys.getallocatedblocks()
    for chunk in answer.streaming_content:
        if lines % 100 == 0:  # a fetch's rows stay alive over its 2,000 rows: reading every 100th sees them
            most = max(most, sys.getallocatedblocks())
        lines += 1
        size += len(chunk)
        largest = max(largest, chunk.count(b"\n"))
        if lines > 1:
            total_used += int(chunk.split(b",")[4])
    grown = most - before
    print(f"exported {lines - 1} subjects, {size} bytes of CSV, at most {largest} row per chunk; "
          f"rows per database fetch {CHUNK}; live blocks grew by at most {grown} (bound {BLOCKS})")
    assert lines == SUBJECTS + 1 and largest == 1
    assert total_used == sum(n % 997 for n in range(SUBJECTS))  # every row, each once
    assert grown < BLOCKS, grown
