"""Calendar quotas and their admin in both of Django's ways of holding datetimes: USE_TZ True (aware, UTC in
the database) and USE_TZ False (naive, in TIME_ZONE), on SQLite and on PostgreSQL when DATABASE_URL is set.
TIME_ZONE is New York, so a naive UTC instant written where local time is expected would be 4-5 hours off."""

from __future__ import annotations

import re
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


# --- deleting a quota policy takes its saved usage --------------------------------------------------


def policy_url(row, page: str = "") -> str:
    return f"/admin/ratelimit_app/policy/{row.pk}/{page}"


def test_a_superuser_deletes_a_quota_policy_and_the_page_counts_the_usage_that_goes_with_it(admin_client, use_tz):
    row = month()
    found = periods_at("month", zone("Europe/Paris"), now_ms())
    saved_usage(row, found.start, 2)
    saved_usage(row, found.previous, 1, first=10)
    other = month(name="other")
    saved_usage(other, found.start, 1, first=20)
    page = admin_client.get(policy_url(row, "delete/"))
    shown = page.content.decode()
    assert page.status_code == 200 and "Cannot delete" not in shown  # was "Cannot delete policy", the POST 403
    assert "Quota usage: 3 saved rows" in shown  # its rows only, counted, not listed one by one
    assert "<li>Quota usage: 3</li>" in shown  # Django's summary
    answer = admin_client.post(policy_url(row, "delete/"), {"post": "yes"})
    assert answer.status_code == 302
    assert list(QuotaUsage.objects.values_list("policy__name", "used")) == [("other", 21)]


def test_staff_with_the_delete_policy_permission_delete_a_quota_policy_with_saved_usage(client, use_tz):
    from django.contrib.auth.models import Permission, User

    staff = User.objects.create_user("ops", password="x", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=["view_policy", "delete_policy"]))
    client.force_login(staff)
    row = month()
    saved_usage(row, periods_at("month", zone("Europe/Paris"), now_ms()).start, 1)
    assert client.get(policy_url(row, "delete/")).status_code == 200
    assert client.post(policy_url(row, "delete/"), {"post": "yes"}).status_code == 302
    assert not QuotaUsage.objects.exists()


def test_the_bulk_delete_action_confirms_then_deletes_quota_policies_with_their_usage(admin_client, use_tz):
    start = periods_at("month", zone("Europe/Paris"), now_ms()).start
    rows = [month(name="first"), month(name="second"), month(name="kept")]
    for n, row in enumerate(rows):
        saved_usage(row, start, n + 1, first=10 * n)
    chosen = {"action": "delete_selected", "_selected_action": [rows[0].pk, rows[1].pk]}
    confirm = admin_client.post("/admin/ratelimit_app/policy/", chosen)
    shown = confirm.content.decode()
    assert confirm.status_code == 200 and "Cannot delete" not in shown  # was "Cannot delete policies"
    assert "Quota usage: 1 saved row " in shown and "Quota usage: 2 saved rows" in shown
    assert "<li>Quota usage: 3</li>" in shown
    done = admin_client.post("/admin/ratelimit_app/policy/", {**chosen, "post": "yes"})
    assert done.status_code == 302
    assert list(QuotaUsage.objects.values_list("policy__name", flat=True)) == ["kept"] * 3


def test_the_usage_admin_itself_still_deletes_nothing(admin_client, use_tz):
    row = month()
    saved_usage(row, periods_at("month", zone("Europe/Paris"), now_ms()).start, 1)
    [usage] = QuotaUsage.objects.all()
    assert admin_client.get(f"{USAGE}{usage.pk}/delete/").status_code == 403
    assert admin_client.post(USAGE, {"action": "delete_selected", "_selected_action": [usage.pk], "post": "yes"}
                             ).status_code in (200, 302)
    assert QuotaUsage.objects.count() == 1


# --- the export's filters are the list's ------------------------------------------------------------

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


def listed(answer) -> list[str]:
    """The subjects a usage list shows, in its order."""
    return re.findall(r"header:x-api-key:k-\d+", answer.content.decode().split('id="result_list"')[-1])


def exported(answer) -> list[str]:
    return [line.split(",")[1] for line in b"".join(answer.streaming_content).decode().splitlines()[1:]]


def test_a_malformed_policy_filter_gives_the_export_a_400_where_the_list_refuses_it_never_a_500(admin_client, use_tz):
    start = periods_at("month", zone("Europe/Paris"), now_ms()).start
    row, other = month(), month(name="other")
    saved_usage(row, start, 2)
    saved_usage(other, start, 1, first=5)
    mine = ["header:x-api-key:k-0", "header:x-api-key:k-1"]
    # value -> what the list does with it, which the export follows: refused (the list's ?e=1), or its rows
    cases = {
        "²": None, "1e3": None, "": None, "1.0": None, "0x1": None, "\x00": None,
        "-1": [], "9" * 400: [], "0": [],
        str(row.pk).translate(ARABIC_INDIC): mine, f" {row.pk}": mine, str(row.pk): mine,  # int() reads them
    }
    admin_client.raise_request_exception = False
    for value, rows in cases.items():
        shown = admin_client.get(USAGE, {"policy__id__exact": value})
        answer = admin_client.get(f"{USAGE}export.csv", {"policy__id__exact": value})
        if rows is None:
            assert (shown.status_code, shown["Location"]) == (302, f"{USAGE}?e=1"), value
            assert answer.status_code == 400, value  # was 500 for ², the whole table for the others
            assert answer.content.decode().startswith("The list's filters are not valid here: ")
        else:
            assert shown.status_code == 200 and sorted(listed(shown)) == rows, value
            assert answer.status_code == 200 and exported(answer) == rows, value  # was every policy's rows for -1


def test_the_export_has_every_filter_and_search_of_the_list(admin_client, use_tz):
    found = periods_at("month", zone("Europe/Paris"), now_ms())
    row, other = month(), month(name="other")
    saved_usage(row, found.start, 3)
    saved_usage(row, found.previous, 1, first=10)
    saved_usage(other, found.start, 1, first=20)
    for query in [{"period": "current", "policy__id__exact": row.pk}, {"period": "previous"}, {"q": "k-2"},
                  {"used__gte": "2", "policy__id__exact": row.pk}, {"period": "bogus", "o": "zzz", "p": "x"}]:
        shown = admin_client.get(USAGE, query)
        assert shown.status_code == 200 and listed(shown), query
        assert sorted(exported(admin_client.get(f"{USAGE}export.csv", query))) == sorted(listed(shown)), query
    refused = admin_client.get(f"{USAGE}export.csv", {"used__gte": "many"})
    assert refused.status_code == 400 and "expected a number but got 'many'" in refused.content.decode()
