"""Calendar quotas and their admin in both of Django's ways of holding datetimes: USE_TZ True (aware, UTC in
the database) and USE_TZ False (naive, in TIME_ZONE), on SQLite and on PostgreSQL when DATABASE_URL is set.
TIME_ZONE is New York, so a naive UTC instant written where local time is expected would be 4-5 hours off."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from ratelimit_app import operations, quotas
from ratelimit_app.models import QuotaUsage
from ratelimit_app.periods import periods_at, zone
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db
USAGE = "/admin/ratelimit_app/quotausage/"


@pytest.fixture(params=[True, False], ids=["aware", "naive"])
def use_tz(request, settings) -> bool:
    settings.USE_TZ = request.param
    settings.TIME_ZONE = "America/New_York"
    return request.param


def now_ms() -> int:
    return int(datetime.now(timezone.utc).timestamp() * 1000)


def month(name: str = "monthly", limit: int = 3, zone_name: str = "Europe/Paris", **fields):
    return make_policy(name=name, strategy="calendar_quota", period="month", time_zone=zone_name, limit=limit,
                       window=1, **fields)


def saved_usage(row, start_ms: int, subjects: int, first: int = 0) -> None:
    QuotaUsage.objects.bulk_create([
        QuotaUsage(policy=row, subject=f"{n:016x}", display=f"header:x-api-key:k-{n}",
                   period_start=quotas.as_stored(start_ms), used=n + 1)
        for n in range(first, first + subjects)
    ])


def saved_starts() -> set[datetime]:
    """The period starts the database holds, as instants (a naive one is in TIME_ZONE)."""
    return {quotas.as_instant(value) for value in QuotaUsage.objects.values_list("period_start", flat=True)}


def test_requests_a_quota_covers_are_counted_and_their_usage_saved_for_the_quotas_month(client, use_tz):
    month(limit=2)
    answers = [client.get("/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)]
    assert answers == [200, 200, 429]  # was 500 each with USE_TZ False
    assert quotas.saver.save() == 1  # was 0: the batch was dropped
    [row] = QuotaUsage.objects.all()
    assert row.used == 2
    start = periods_at("month", zone("Europe/Paris"), now_ms()).start
    assert saved_starts() == {quotas.as_datetime(start)}  # the Paris month's first instant, whatever the setting


def test_a_period_redis_lost_starts_again_from_the_usage_saved(client, redis_client, use_tz):
    month(limit=3)
    assert [client.get("/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(2)] == [200, 200]
    assert quotas.saver.save() == 1
    quotas.saver.discard()
    redis_client.flushall()
    assert [client.get("/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(2)] == [200, 429]


def test_resetting_a_quota_drops_the_usage_saved_for_its_current_period(use_tz):
    row = month()
    found = periods_at("month", zone("Europe/Paris"), now_ms())
    saved_usage(row, found.start, 2)
    saved_usage(row, found.previous, 1, first=10)
    operations.reset_all(row)
    assert saved_starts() == {quotas.as_datetime(found.previous)}


def test_the_admin_lists_and_exports_the_current_and_previous_periods(admin_client, use_tz):
    row = month(zone_name="Asia/Tokyo")
    found = periods_at("month", zone("Asia/Tokyo"), now_ms())
    saved_usage(row, found.start, 2)
    saved_usage(row, found.previous, 1, first=10)
    current = admin_client.get(f"{USAGE}?period=current")
    assert current.status_code == 200  # was 500 with USE_TZ False
    assert "k-1<" in current.content.decode() and "k-10<" not in current.content.decode()
    previous = admin_client.get(f"{USAGE}?period=previous").content.decode()
    assert "k-10<" in previous and "k-1<" not in previous
    answer = admin_client.get(f"{USAGE}export.csv?period=current")
    assert answer.status_code == 200
    lines = b"".join(answer.streaming_content).decode().splitlines()
    # the period's first instant in UTC, whichever way the database holds it
    begun = quotas.as_datetime(found.start).isoformat()
    assert [line.split(",")[1:5] for line in lines[1:]] == [
        ["header:x-api-key:k-0", f"{0:016x}", begun, "1"], ["header:x-api-key:k-1", f"{1:016x}", begun, "2"]]
    assert all(line.split(",")[5].endswith("+00:00") for line in lines[1:])

