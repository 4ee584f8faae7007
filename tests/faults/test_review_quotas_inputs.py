"""Calendar quotas given odd input, as a hostile reviewer would: formula-like subjects and a search in the
billing export, the export under ASGI, days of 23.5, 25 and 0 hours, a rate of seconds typed on a quota,
shadow mode."""

from __future__ import annotations

import asyncio
import csv
import io
import tracemalloc
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import async_to_sync
from django.core.asgi import get_asgi_application
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from ratelimit_app import engine, quotas
from ratelimit_app.models import Policy, QuotaUsage
from ratelimit_app.policies import compile_policy
from ratelimit_app.portable import ImportRefused, import_data
from ratelimit_app.subjects import subject_for
from ratelimit_app.values import Check
from tests.helpers import check, insert_usage, make_policy

pytestmark = pytest.mark.django_db(transaction=True)

# --- the billing export ------------------------------------------------------------------------------


def _customer(value: str):
    request = RequestFactory().get("/api/", HTTP_X_CUSTOMER=value, REMOTE_ADDR="203.0.113.9")
    request.user = AnonymousUser()
    return request


def test_the_csv_export_shows_what_the_search_finds_and_no_cell_a_spreadsheet_would_run(settings, admin_client):
    settings.RATELIMIT_PLAIN_HEADERS = ["X-Customer"]
    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=100,
                      window=1, key="header:X-Customer")
    limited = compile_policy(row)
    hostile = ["=cmd|' /C calc'!A0", "+1,2\n3", "@SUM(1)", "-2+3", "ünï,\"quoted\"", "acme"]
    for value in hostile:
        who = subject_for(limited.key_spec, _customer(value))
        assert engine.decide([Check(limited, who, limited.limit)]).allowed
    quotas.saver.save()
    exported = admin_client.get("/admin/ratelimit_app/quotausage/export.csv")
    cells = list(csv.reader(io.StringIO(b"".join(exported.streaming_content).decode())))
    assert len(cells) == 1 + len(hostile)
    assert not [cell for line in cells for cell in line if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    found = admin_client.get("/admin/ratelimit_app/quotausage/?q=acme").content.decode()
    assert "header:X-Customer=acme" in found and "calc" not in found
    searched = admin_client.get("/admin/ratelimit_app/quotausage/export.csv?q=acme")
    rows = list(csv.reader(io.StringIO(b"".join(searched.streaming_content).decode())))
    assert [line[1] for line in rows[1:]] == ["header:X-Customer=acme"]  # was every row: the search was ignored


# --- days that are not 24 hours -------------------------------------------------------------------------


@pytest.mark.parametrize("name, last_second, wait, next_day", [
    ("America/Sao_Paulo", datetime(2019, 2, 16, 23, 59, 59), 3601, 86400),  # midnight came twice: a 25 h day
    ("America/Sao_Paulo", datetime(2018, 11, 3, 23, 59, 59), 1, 82800),  # midnight never came: from 01:00
    ("Pacific/Apia", datetime(2011, 12, 29, 23, 59, 59), 1, 86400),  # 30 December 2011 never was
    ("Australia/Lord_Howe", datetime(2023, 9, 30, 23, 59, 59), 1, 84600),  # a half-hour change: 23.5 h
])
def test_a_day_quota_refused_at_its_last_second_waits_until_the_real_next_midnight(name, last_second, wait, next_day):
    limited = compile_policy(make_policy(name="daily", strategy="calendar_quota", period="day", time_zone=name,
                                         limit=1, window=1))
    now = last_second.replace(tzinfo=ZoneInfo(name)).timestamp()
    assert engine.decide([check(limited)], now=now).allowed
    [refused] = engine.decide([check(limited)], now=now).decisions
    assert (refused.allowed, refused.retry_after) == (False, wait)
    [fresh] = engine.decide([check(limited)], now=now + wait).decisions
    assert (fresh.allowed, fresh.count, fresh.window) == (True, 1, next_day)


# --- a rate of seconds on a calendar quota ---------------------------------------------------------------


def test_a_rate_of_seconds_given_to_a_calendar_quota_is_refused_not_counted_per_month(admin_client):
    row = make_policy(name="api-month", strategy="calendar_quota", period="month", time_zone="UTC", limit=10000,
                      window=1)
    answer = admin_client.post(f"/admin/ratelimit_app/policy/{row.pk}/change/", {
        "name": "api-month", "action": "*", "rate": "100/m", "strategy": "calendar_quota", "period": "month",
        "time_zone": "UTC", "key": "ip", "mode": "enforce", "enabled": "on",
        "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0",
    })
    assert answer.status_code == 200 and "a window of seconds" in answer.content.decode()  # was 100 a month
    with pytest.raises(ImportRefused, match="a window of seconds"):
        import_data({"format": "ratelimit_app/1", "policies": [{"name": "api-month", "rate": "100/m"}]})
    assert Policy.objects.values_list("limit", "period").get() == (10000, "month")


def test_a_shadow_quota_never_refuses_nor_shows_and_saves_what_it_counted(client):
    make_policy(name="shadow-month", action="demo:search", strategy="calendar_quota", period="month",
                time_zone="UTC", limit=2, window=1, mode="shadow")
    answers = [client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7") for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200] * 4
    assert not [answer for answer in answers if "shadow-month" in answer.get("RateLimit-Policy", "")]
    quotas.saver.save()
    assert QuotaUsage.objects.get().used == 2  # at its limit it records what it would deny instead


# --- the export under an ASGI server ---------------------------------------------------------------------


async def _export_through_asgi(cookie: str) -> tuple[int, int]:
    """The export as an ASGI server serves it (Django's ASGI handler): the lines sent and the peak memory."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": "/admin/ratelimit_app/quotausage/export.csv", "raw_path": b"/admin/ratelimit_app/quotausage/export.csv",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
        "headers": [(b"host", b"testserver"), (b"cookie", cookie.encode())],
    }
    asked, lines = [], [0]

    async def receive() -> dict:
        if asked:
            await asyncio.Future()  # the client stays until the answer is whole
        asked.append(1)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        lines[0] += message.get("body", b"").count(b"\n")

    tracemalloc.start()
    await get_asgi_application()(scope, receive, send)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return lines[0], peak


def _saved_rows(row, start_ms: int, count: int, first: int = 0) -> None:
    insert_usage(row.pk, quotas.as_datetime(start_ms), count, first, display="header:x-api-key=k-")


@pytest.mark.slow
def test_under_asgi_the_csv_export_of_many_subjects_takes_the_memory_of_a_few(admin_client):
    """5,000 and 50,000 rows through Django's ASGI handler: the same peak (50,000 rows held at once would
    take over 10 MB)."""
    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=1000, window=1)
    cookie = f"sessionid={admin_client.cookies['sessionid'].value}"
    _saved_rows(row, 0, 5_000)
    lines, small = async_to_sync(_export_through_asgi)(cookie)
    assert lines == 5_001
    _saved_rows(row, 0, 45_000, first=5_000)
    lines, large = async_to_sync(_export_through_asgi)(cookie)
    assert lines == 50_001
    assert large < small * 1.5 + 1_000_000, (small, large)  # was 5 times as much: the rows were listed whole


def test_resetting_a_quota_whose_zone_went_bad_behind_the_admins_back_still_resets(admin_client):
    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=10, window=1)
    Policy.objects.filter(pk=row.pk).update(time_zone="Mars/Olympus")
    answer = admin_client.post("/admin/ratelimit_app/policy/", {"action": "reset_counts", "_selected_action": [row.pk]})
    assert answer.status_code == 302
    assert Policy.objects.get(pk=row.pk).generation == row.generation + 1
