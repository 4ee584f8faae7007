"""Calendar quotas: periods against a reference model (hypothesis over instants, DST, month ends, leap
years), the quota strategy decided by the real Lua on the real server, exact under 8 processes with
costs, all-or-nothing with other policies, the headers' `t` and `w`, usage() for a dashboard, and bad
input refused plainly."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.http import HttpResponse
from django.test import RequestFactory
from hypothesis import HealthCheck, given, settings, strategies as st

import ratelimit_app
from ratelimit_app import engine, quotas
from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import Policy, QuotaUsage
from ratelimit_app.periods import periods_at, zone
from ratelimit_app.rates import parse_quota
from ratelimit_app.registry import code_policy
from tests.helpers import check, in_processes, insert_usage, make_policy, policy
from tests.servers import ROOT, manage, site_env

ZONES = ["UTC", "Europe/Paris", "America/New_York", "America/Santiago", "Australia/Lord_Howe", "Asia/Kolkata",
         "Pacific/Apia", "America/Havana", "Asia/Tehran"]
FROM, TO = datetime(1995, 1, 1, tzinfo=timezone.utc), datetime(2045, 1, 1, tzinfo=timezone.utc)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def local(instant_ms: int, name: str) -> datetime:
    return datetime.fromtimestamp(instant_ms / 1000, ZoneInfo(name))


def label(period: str, instant_ms: int, name: str) -> tuple:
    """Which period an instant belongs to, read plainly from its local date: the reference model."""
    day = local(instant_ms, name).date()
    if period == "day":
        return (day,)
    if period == "week":
        return tuple(day.isocalendar())[:2]
    return (day.year, day.month)


# --- periods against the reference model -------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(
    instant=st.datetimes(min_value=FROM.replace(tzinfo=None), max_value=TO.replace(tzinfo=None)),
    name=st.sampled_from(ZONES),
    period=st.sampled_from(["day", "week", "month"]),
)
def test_a_period_holds_exactly_the_instants_of_its_local_day_week_or_month(instant, name, period):
    now = ms(instant.replace(tzinfo=timezone.utc))
    found = periods_at(period, zone(name), now)
    here = label(period, now, name)
    assert found.start <= now < found.end
    assert label(period, found.start, name) == here and label(period, found.end - 1, name) == here
    assert label(period, found.start - 1, name) != here and label(period, found.end, name) != here
    # the neighbours are whole periods that touch it
    assert label(period, found.previous, name) == label(period, found.start - 1, name) != label(period, found.previous - 1, name)
    assert label(period, found.after - 1, name) == label(period, found.end, name) != label(period, found.after, name)


@pytest.mark.parametrize(("name", "day", "hours"), [
    ("Europe/Paris", "2026-03-29", 23), ("Europe/Paris", "2026-10-25", 25), ("Europe/Paris", "2026-06-01", 24),
    ("America/New_York", "2026-03-08", 23), ("America/New_York", "2026-11-01", 25),
    ("Australia/Lord_Howe", "2026-04-05", 24.5), ("Pacific/Apia", "2011-12-29", 24),
])
def test_days_across_dst_changes_last_23_or_25_hours(name, day, hours):
    noon = datetime.fromisoformat(f"{day}T12:00:00").replace(tzinfo=ZoneInfo(name))
    found = periods_at("day", zone(name), ms(noon))
    assert (found.end - found.start) / 3_600_000 == hours


@pytest.mark.parametrize(("month", "days"), [("2024-02", 29), ("2026-02", 28), ("2100-02", 28), ("2000-02", 29),
                                             ("2026-01", 31), ("2026-04", 30), ("2026-12", 31)])
def test_months_have_their_real_length(month, days):
    found = periods_at("month", zone("UTC"), ms(datetime.fromisoformat(f"{month}-15T00:00:00+00:00")))
    assert (found.end - found.start) // 86_400_000 == days
    assert datetime.fromtimestamp(found.start / 1000, timezone.utc).day == 1


def test_a_week_starts_on_monday_in_the_policys_zone():
    # Sunday 2026-11-29 23:30 in UTC is already Monday 00:30 in Paris
    found = periods_at("week", zone("Europe/Paris"), ms(datetime(2026, 11, 29, 23, 30, tzinfo=timezone.utc)))
    assert local(found.start, "Europe/Paris") == datetime(2026, 11, 30, tzinfo=ZoneInfo("Europe/Paris"))


# --- rates and bad input ------------------------------------------------------------------------


def test_rates_say_month_week_and_calendar_day_while_day_stays_86400_seconds():
    assert parse_quota("10000/month") == (10000, "month")
    assert parse_quota("500/week") == (500, "week")
    assert parse_quota("1000/calendar-day") == (1000, "day")
    assert parse_quota("1000/day") is None  # a window of 86,400 seconds, as before
    declared = code_policy("monthly", action="*", origin="test", rate="10000/month", key="header:x-api-key")
    assert (declared.values["strategy"], declared.values["period"], declared.values["limit"]) == ("calendar_quota", "month", 10000)
    day = code_policy("daily", action="*", origin="test", rate="1000/day")
    assert (day.values["window"], day.values["period"]) == (86400, "")


@pytest.mark.django_db
def test_a_time_zone_that_does_not_exist_is_refused_with_a_message():
    row = Policy(name="q", action="*", limit=10, window=1, strategy="calendar_quota", period="month", time_zone="Mars/Olympus")
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert "'Mars/Olympus' is not a time zone" in str(refused.value.message_dict["time_zone"])
    with pytest.raises(ImproperlyConfigured, match="is not a time zone"):
        code_policy("bad-zone", action="*", origin="@ratelimit", rate="10/month", time_zone="Nowhere/Else")


@pytest.mark.django_db
def test_a_period_a_strategy_cannot_count_is_refused_with_a_message():
    row = Policy(name="q", action="*", limit=10, window=60, strategy="sliding_window", period="month")
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert "not by the calendar" in " ".join(refused.value.message_dict["period"])
    with pytest.raises(ImproperlyConfigured, match="not by the calendar"):
        code_policy("bad-strategy", action="*", origin="@ratelimit", rate="10/month", strategy="token_bucket")
    quota = Policy(name="q", action="*", limit=10, window=60, strategy="calendar_quota")
    with pytest.raises(ValidationError) as refused:
        quota.full_clean()
    assert "day, week or month" in " ".join(refused.value.message_dict["period"])


@pytest.mark.django_db
def test_the_admin_form_takes_a_calendar_rate_and_a_zone(admin_client):
    answer = admin_client.post("/admin/ratelimit_app/policy/add/", {
        "name": "monthly", "action": "/api/", "rate": "10000/month", "strategy": "sliding_window",
        "time_zone": "Europe/Paris", "key": "ip", "mode": "enforce", "enabled": "on",
        "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0",
    })
    assert answer.status_code == 302, answer.content.decode()[:3000]
    saved = Policy.objects.get(name="monthly")
    assert (saved.strategy, saved.period, saved.time_zone, saved.limit) == ("calendar_quota", "month", "Europe/Paris", 10000)
    refused = admin_client.post("/admin/ratelimit_app/policy/add/", {
        "name": "daily", "action": "/api/", "rate": "100/calendar-day", "time_zone": "Europe/Pariss",
        "key": "ip", "mode": "enforce", "enabled": "on", "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0",
    })
    assert refused.status_code == 200 and "is not a time zone" in refused.content.decode()


# --- the engine -----------------------------------------------------------------------------------

NOON = datetime(2026, 1, 31, 12, tzinfo=ZoneInfo("Europe/Paris"))


def quota(period="month", zone_name="Europe/Paris", **fields):
    return policy(strategy="calendar_quota", period=period, time_zone=zone_name, window=1, **fields)


@pytest.mark.django_db
def test_a_month_counts_until_its_last_instant_and_tells_the_wait_until_the_first(redis_client):
    limited = quota(limit=3)
    end = datetime(2026, 2, 1, tzinfo=ZoneInfo("Europe/Paris"))
    now = NOON.timestamp()
    assert [engine.decide([check(limited)], now=now).allowed for _ in range(4)] == [True, True, True, False]
    [refused] = engine.decide([check(limited)], now=now).decisions
    assert refused.retry_after == pytest.approx((end - NOON).total_seconds())
    assert refused.window == 31 * 86400
    last = end.timestamp() - 0.001
    assert not engine.decide([check(limited)], now=last).allowed
    [fresh] = engine.decide([check(limited)], now=end.timestamp()).decisions
    assert (fresh.allowed, fresh.count, fresh.window) == (True, 1, 28 * 86400)


@pytest.mark.django_db
def test_on_the_servers_clock_a_quota_counts_and_its_counter_ends_with_the_period(redis_client):
    limited = quota(period="day", zone_name="UTC", limit=2)
    assert [engine.decide([check(limited)]).allowed for _ in range(3)] == [True, True, False]
    [counter] = redis_client.keys("*q*")
    midnight = (datetime.now(timezone.utc) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert redis_client.pexpiretime(counter) == ms(midnight)


@pytest.mark.django_db
def test_a_refusal_by_a_quota_counts_nothing_in_the_other_policies_and_the_reverse():
    monthly, minute = quota(limit=5), policy(limit=2, window=60)
    now = NOON.timestamp()
    assert engine.decide([check(monthly), check(minute)], now=now, cost=2).allowed
    assert not engine.decide([check(monthly), check(minute)], now=now, cost=2).allowed  # the minute is full
    assert [d.count for d in engine.decide([check(monthly), check(minute)], now=now, dry_run=True).decisions] == [2, 2]
    assert not engine.decide([check(monthly), check(policy(limit=100, window=60))], now=now + 60, cost=4).allowed
    assert engine.decide([check(monthly)], now=now, dry_run=True).decisions[0].count == 2


def _costly(limited, start, results):
    start.wait()
    results.put(sum(engine.decide([check(limited)], cost=3).allowed for _ in range(100)))


@pytest.mark.django_db
@pytest.mark.parametrize("first", ["in Redis", "absent"])
def test_eight_processes_of_cost_3_against_300_admit_exactly_100(first):
    limited = quota(period="month", zone_name="UTC", limit=300)
    if first == "in Redis":
        assert engine.decide([check(limited)], cost=3).allowed
    assert sum(in_processes(_costly, (limited,))) == (99 if first == "in Redis" else 100)
    [decision] = engine.decide([check(limited)], dry_run=True).decisions
    assert (decision.count, decision.remaining) == (300, 0)


# --- durability -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_flushall_starts_the_period_again_from_the_saved_usage(redis_client, django_assert_num_queries):
    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=10, window=1)
    from ratelimit_app.policies import compile_policy

    limited = compile_policy(row)
    assert all(engine.decide([check(limited)], cost=2).allowed for _ in range(3))
    assert quotas.saver.save() == 1
    assert QuotaUsage.objects.get().used == 6
    assert engine.decide([check(limited)]).allowed  # 7: not saved yet
    quotas.saver.discard()  # the worker that counted it is gone too
    redis_client.flushall()
    with django_assert_num_queries(1):  # the first decision after the loss reads what was saved
        assert engine.decide([check(limited)], cost=4).allowed  # 6 saved + 4: the one unsaved unit is lost
    with django_assert_num_queries(0):
        assert not engine.decide([check(limited)]).allowed  # steady state: Redis alone
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 10


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_lost_redis_starts_from_what_it_has_not_saved_yet(redis_client):
    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=10, window=1)
    from ratelimit_app.policies import compile_policy

    limited = compile_policy(row)
    assert all(engine.decide([check(limited)], cost=2).allowed for _ in range(3))
    quotas.saver.save()
    assert engine.decide([check(limited)]).allowed  # 7, pending in this worker
    redis_client.flushall()
    assert not engine.decide([check(limited)], cost=4).allowed  # 7 + 4 > 10
    assert engine.decide([check(limited)], cost=3).allowed
    quotas.saver.save()
    assert QuotaUsage.objects.get().used == 10


# --- usage for the people who pay ------------------------------------------------------------------


def _caller(key="k-123"):
    made = RequestFactory().get("/api/usage", REMOTE_ADDR="203.0.113.9", HTTP_X_API_KEY=key)
    made.user = AnonymousUser()
    return made


@pytest.mark.django_db
def test_usage_lists_the_callers_quotas_and_rate_limits_counting_nothing():
    make_policy(name="monthly", action="/api/", strategy="calendar_quota", period="month", time_zone="UTC", limit=1000,
                window=1, key="header:x-api-key")
    make_policy(name="per-minute", action="*", limit=10, window=60, key="ip")
    make_policy(name="watching", action="*", limit=10, window=60, key="ip", mode="shadow")

    @ratelimit("/api/")
    def view(request):
        return HttpResponse("ok")

    for _ in range(3):
        ratelimit_app.hit(_caller(), "/api/")
    shown = {item.policy: item for item in ratelimit_app.usage(_caller())}
    assert {"monthly", "per-minute"} <= set(shown) and "watching" not in shown  # a shadow policy never shows to clients
    month = shown["monthly"]
    assert (month.used, month.limit, month.remaining, month.period) == (3, 1000, 997, "month")
    first_of_next = (datetime.now(timezone.utc).replace(day=28) + timedelta(days=4)).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    assert abs((month.resets_at - first_of_next).total_seconds()) <= 1
    assert month.as_dict()["resets_at"].startswith(first_of_next.date().isoformat())
    again = {item.policy: item.used for item in ratelimit_app.usage(_caller())}
    assert (again["monthly"], again["per-minute"]) == (3, 3)  # looking counted nothing
    assert {item.policy: item.used for item in ratelimit_app.usage(_caller("other"))}["monthly"] == 0


@pytest.mark.django_db(transaction=True)  # the policy is written from another thread
async def test_ausage_is_usage_for_async_views():
    from asgiref.sync import sync_to_async

    await sync_to_async(make_policy)(name="weekly", strategy="calendar_quota", period="week", time_zone="UTC", limit=50,
                                     window=1, key="header:x-api-key")
    await ratelimit_app.ahit(_caller(), "anything")
    # policies declared by other tests' views may apply to the caller too
    [item] = [item for item in await ratelimit_app.ausage(_caller()) if item.policy == "weekly"]
    assert (item.policy, item.used, item.remaining, item.window) == ("weekly", 1, 49, 7 * 86400)
    # the executor thread's connection: left open, it keeps PostgreSQL from dropping the test database
    from django.db import connections

    await sync_to_async(connections.close_all)()


@pytest.mark.django_db
def test_a_declared_monthly_quota_answers_429_with_the_wait_until_the_next_month():
    @ratelimit(rate="2/month", key="header:x-api-key", time_zone="UTC")
    def view(request):
        return HttpResponse("ok")

    answers = [view(_caller()) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    now = datetime.now(timezone.utc)
    first_of_next = (now.replace(day=28) + timedelta(days=4)).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    wait = int(answers[2].headers["Retry-After"])
    assert abs(wait - (first_of_next - now).total_seconds()) <= 2
    length = periods_at("month", zone("UTC"), ms(now))
    assert f";q=2;w={(length.end - length.start) // 1000}" in answers[0].headers["RateLimit-Policy"]


# --- the admin's usage and its export ------------------------------------------------------------------


def _saved_usage(row, start_ms: int, count: int, first: int = 0) -> None:
    from ratelimit_app.quotas import as_datetime

    insert_usage(row.pk, as_datetime(start_ms), count, first)


@pytest.mark.django_db
def test_the_admin_lists_usage_of_the_current_and_previous_periods_and_exports_them_as_csv(admin_client):
    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=1000, window=1)
    found = periods_at("month", zone("UTC"), ms(datetime.now(timezone.utc)))
    _saved_usage(row, found.start, 3)
    _saved_usage(row, found.previous, 2, first=10)
    current = admin_client.get("/admin/ratelimit_app/quotausage/?period=current").content.decode()
    assert "k-2" in current and "k-10" not in current and "Export CSV" in current
    previous = admin_client.get("/admin/ratelimit_app/quotausage/?period=previous").content.decode()
    assert "k-10" in previous and "k-2" not in previous
    answer = admin_client.get(f"/admin/ratelimit_app/quotausage/export.csv?period=previous&policy__id__exact={row.pk}")
    assert answer.streaming and answer["Content-Type"].startswith("text/csv")
    lines = b"".join(answer.streaming_content).decode().splitlines()
    assert lines[0] == "policy,subject,subject_key,period_start,used,saved,unit,limit,overage"
    assert [line.split(",")[1] for line in lines[1:]] == ["header:x-api-key:k-10", "header:x-api-key:k-11"]


@pytest.mark.django_db
def test_saved_usage_keeps_the_subjects_limit_and_the_export_bills_what_went_beyond_it(admin_client):
    from ratelimit_app import engine, quotas
    from ratelimit_app.policies import compile_policy
    from ratelimit_app.values import Check
    from tests.helpers import subject

    row = make_policy(name="chat-month", strategy="calendar_quota", period="month", time_zone="UTC", limit=1000,
                      window=1, key="ip", unit="tokens")
    pro, free = subject("ip:198.51.100.1"), subject("ip:198.51.100.2")
    assert engine.decide([Check(compile_policy(row), pro, 5000, "pro")], cost=3000).allowed  # on a plan of 5,000
    assert engine.decide([Check(compile_policy(row), free, 1000)], cost=800).allowed
    quotas.saver.save()
    saved = {usage.display: usage for usage in QuotaUsage.objects.all()}
    assert (saved[pro.display].used, saved[pro.display].limit) == (3000, 5000)
    QuotaUsage.objects.filter(subject=pro.key).update(used=6200)  # settles took the customer beyond the plan
    QuotaUsage.objects.filter(subject=free.key).update(limit=None)  # saved before limits were kept
    lines = b"".join(admin_client.get("/admin/ratelimit_app/quotausage/export.csv").streaming_content).decode()
    rows = {line.split(",")[1]: line.split(",")[6:] for line in lines.splitlines()[1:]}
    assert rows == {pro.display: ["tokens", "5000", "1200"], free.display: ["tokens", "1000", "0"]}
    listed = admin_client.get("/admin/ratelimit_app/quotausage/").content.decode()
    assert '<td class="field-overage">1200</td>' in listed and '<td class="field-unit">tokens</td>' in listed


@pytest.mark.django_db
def test_the_admin_refuses_the_export_to_who_may_not_look(client, django_user_model):
    staff = django_user_model.objects.create_user("staff", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/ratelimit_app/quotausage/export.csv").status_code == 403


@pytest.mark.slow
@pytest.mark.django_db
def test_the_csv_export_of_many_subjects_takes_the_memory_of_a_few(admin_client):
    """The export's peak memory does not grow with the rows: 5,000 and 50,000 rows stream in chunks of
    the same size (the rows of 50,000 subjects held at once would take over 10 MB)."""
    import tracemalloc

    row = make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=1000, window=1)
    start = periods_at("month", zone("UTC"), ms(datetime.now(timezone.utc))).start

    def peak_of_export() -> tuple[int, int]:
        answer = admin_client.get("/admin/ratelimit_app/quotausage/export.csv")
        tracemalloc.start()
        lines = sum(chunk.count(b"\n") for chunk in answer.streaming_content)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return lines, peak

    _saved_usage(row, start, 5_000)
    lines, small = peak_of_export()
    assert lines == 5_001
    _saved_usage(row, start, 45_000, first=5_000)
    lines, large = peak_of_export()
    assert lines == 50_001
    assert large < small * 1.5 + 1_000_000, (small, large)


@pytest.mark.django_db
def test_export_and_import_carry_a_quotas_period_and_zone():
    from ratelimit_app import portable

    make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="Europe/Paris", limit=100, window=1)
    exported = portable.export_data()
    Policy.objects.all().delete()
    portable.import_data(exported)
    saved = Policy.objects.get(name="monthly")
    assert (saved.strategy, saved.period, saved.time_zone, saved.limit) == ("calendar_quota", "month", "Europe/Paris", 100)
    portable.import_data({"format": exported["format"], "policies": [
        {"name": "weekly", "action": "/api/", "rate": "500/week", "key": "ip", "strategy": "sliding_window",
         "methods": "", "mode": "enforce", "enabled": True, "description": ""}]})
    assert Policy.objects.get(name="weekly").period == "week"
    with pytest.raises(portable.ImportRefused, match="is not a time zone"):
        portable.import_data({"format": exported["format"], "policies": [{**exported["policies"][0], "time_zone": "Europe/Nowhere"}]})


@pytest.mark.django_db
def test_a_repeat_quota_decision_is_fcall_and_incrby_as_a_fixed_windows(redis_client):
    from tests.helpers import server_commands_per_call

    limited = quota(zone_name="UTC", limit=10**9)
    engine.decide([check(limited)])  # the period's first: it reads the saved usage and the clock
    assert server_commands_per_call(redis_client, lambda: engine.decide([check(limited)])) == 2


@pytest.mark.django_db
def test_a_plan_gives_its_customers_their_monthly_quota():
    from ratelimit_app.models import Plan, PlanAssignment, PlanLimit

    @ratelimit(rate="2/month", key="header:x-api-key", time_zone="UTC", name="api-month")
    def view(request):
        return HttpResponse("ok")

    view(_caller("k-free"))  # the declaration is written to the database
    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=Policy.objects.get(name="api-month"), limit=4)
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value="k-pro")
    free = [view(_caller("k-free")).status_code for _ in range(2)]
    paid = [view(_caller("k-pro")) for _ in range(5)]
    assert free == [200, 429]
    assert [a.status_code for a in paid] == [200, 200, 200, 200, 429]
    assert '"api-month";q=4;' in paid[0].headers["RateLimit-Policy"]
    [item] = [item for item in ratelimit_app.usage(_caller("k-pro")) if item.policy == "api-month"]
    assert (item.used, item.limit, item.plan) == (4, 4, "pro")


@pytest.mark.django_db
def test_a_quota_row_with_a_zone_that_does_not_exist_is_skipped_and_reported_by_the_checks(client):
    from django.core.checks import run_checks

    make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC", limit=1, window=1)
    Policy.objects.filter(name="monthly").update(time_zone="Europe/Atlantis")  # past the form, as raw SQL would
    [warning] = [m for m in run_checks() if m.id == "ratelimit_app.W001"]
    assert "monthly" in warning.msg and "'Europe/Atlantis' is not a time zone" in warning.msg
    assert [client.get("/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(2)] == [200, 200]


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sequence=st.lists(st.tuples(st.integers(min_value=0, max_value=9 * 86_400_000), st.sampled_from([1, 1, 2, 5])), min_size=1, max_size=30),
    period=st.sampled_from(["day", "week", "month"]),
    name=st.sampled_from(["Europe/Paris", "America/Santiago", "UTC"]),
)
def test_the_quota_strategy_decides_as_the_calendar_does(redis_client, sequence, period, name):
    """The real Lua against the reference model: units counted per calendar label, a refusal waits
    until the period's end, across month ends, DST days and leap years (2028)."""
    redis_client.flushdb()
    limited = quota(period=period, zone_name=name, limit=4)
    now, used = ms(datetime(2028, 2, 20, 22, tzinfo=timezone.utc)), {}
    for gap, cost in sequence:
        now += gap
        here = label(period, now, name)
        fits = used.get(here, 0) + cost <= 4
        if fits:
            used[here] = used.get(here, 0) + cost
        [decision] = engine.decide([check(limited)], now=now / 1000, cost=cost).decisions
        assert (decision.allowed, decision.count) == (fits, used.get(here, 0)), (local(now, name), cost)
        if not fits and cost <= 4:
            assert round(decision.retry_after * 1000) == periods_at(period, zone(name), now).end - now


@pytest.mark.django_db
def test_the_live_page_lists_a_quotas_subjects_with_the_time_to_the_periods_end():
    from ratelimit_app import live

    limited = quota(period="day", zone_name="UTC", limit=10)
    engine.decide([check(limited, "ip:198.51.100.1")], cost=3)
    engine.decide([check(limited, "ip:198.51.100.2")])
    shown = live.live_usage(limited)
    assert {s.display: s.count for s in shown.subjects} == {"ip:198.51.100.1": 3, "ip:198.51.100.2": 1}
    ends = periods_at("day", zone("UTC"), ms(datetime.now(timezone.utc))).end / 1000 - datetime.now(timezone.utc).timestamp()
    assert all(abs(s.reset_in - ends) < 5 for s in shown.subjects)
    assert live.live_usage(limited, now=datetime.now(timezone.utc).timestamp()).subjects


def test_an_engine_whose_usage_keeper_is_not_set_starts_a_quotas_period_from_nothing(monkeypatch, redis_client):
    """The engine asks the saved usage through its hook; without the layer that sets it (quotas.py), a period
    Redis does not hold starts from zero, and nothing of it is kept beyond Redis: the quota still counts."""
    from ratelimit_app.engine.hooks import Hooks

    bare = Hooks()
    monkeypatch.setattr(engine.hooks, "saved_usage", bare.saved_usage)
    monkeypatch.setattr(engine.hooks, "counted", bare.counted)
    quotas.saver.discard()
    limited = quota(period="day", zone_name="UTC", limit=2)
    assert [engine.decide([check(limited)]).allowed for _ in range(3)] == [True, True, False]
    assert quotas.saver.save() == 0  # nothing was handed to the saver


@pytest.mark.django_db
def test_a_quota_per_user_shows_the_users_name_in_the_admin_the_export_and_top(client, admin_client):
    from io import StringIO

    from django.contrib.auth.models import User
    from django.core.management import call_command

    row = make_policy(name="searches-per-user", action="demo:search", strategy="calendar_quota", period="month",
                      time_zone="UTC", limit=100, window=1, key="user")
    alice = User.objects.create_user("alice")
    client.force_login(alice)
    assert [client.get("/demo/search/?q=a").status_code for _ in range(3)] == [200] * 3
    live = admin_client.get(f"/admin/ratelimit_app/policy/{row.pk}/live/?format=json").json()
    assert [(s["subject"], s["count"]) for s in live["subjects"]] == [("user:alice", 3)]
    top = StringIO()
    call_command("ratelimit", "top", "searches-per-user", stdout=top)
    assert "user:alice" in top.getvalue() and f"user:{alice.pk} " not in top.getvalue()
    quotas.saver.save()
    assert QuotaUsage.objects.get().display == "user:alice"
    exported = b"".join(admin_client.get("/admin/ratelimit_app/quotausage/export.csv").streaming_content).decode()
    assert exported.splitlines()[1].startswith("searches-per-user,user:alice,")
    assert "user:alice" in admin_client.get("/admin/ratelimit_app/quotausage/").content.decode()


SAVED_BEFORE_UNITS = """
import django
django.setup()
from django.db import connection
from tests.helpers import make_policy
for name, unit in (("llm-month", "tokens"), ("api-month", "requests")):
    row = make_policy(name=name, action=name, limit=1000, window=31 * 86400, strategy="calendar_quota",
                      period="month", time_zone="UTC", unit=unit)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO ratelimit_app_quotausage (policy_id, subject, display, period_start, used, "
                       "updated, kept) VALUES (%s, 'k', 'ip:203.0.113.7', '2026-12-01 00:00:00', 900, "
                       "'2026-12-07 00:00:00', 0)", [row.pk])
"""


def test_usage_saved_before_it_had_a_unit_counts_its_policys_unit_after_the_upgrade(tmp_path):
    """A tokens quota's rows saved by the previous release are tokens: its counter goes on from them and the
    export bills them in tokens, not as requests."""
    env = site_env(tmp_path / "db.sqlite3")
    manage(env, "migrate", "ratelimit_app", "0012")
    done = subprocess.run([sys.executable, "-c", SAVED_BEFORE_UNITS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    manage(env, "migrate", "ratelimit_app")
    with sqlite3.connect(tmp_path / "db.sqlite3") as database:
        units = database.execute("SELECT p.name, u.unit, u.used FROM ratelimit_app_quotausage u "
                                 "JOIN ratelimit_app_policy p ON p.id = u.policy_id ORDER BY p.name").fetchall()
    assert units == [("api-month", "requests", 900), ("llm-month", "tokens", 900)]
