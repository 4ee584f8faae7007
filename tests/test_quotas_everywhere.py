"""Calendar quotas wherever the other strategies go: the headers' `t` and `w` on a request (the wait until
the next midnight in the policy's zone, a DST day's 23 or 25 hours), shadow mode, the deny cache, eight
processes deciding a quota and a window in one call, the admin's change page, and usage() after Redis
lost its counters."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import AnonymousUser
from django.http import HttpResponse
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import engine, headers, quotas
from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import Policy
from tests.helpers import check, count_round_trips, in_processes, make_policy, policy

pytestmark = pytest.mark.django_db
KEY = "k-customer"


def caller(key: str = KEY):
    made = RequestFactory().get("/api/things", REMOTE_ADDR="203.0.113.9", HTTP_X_API_KEY=key)
    made.user = AnonymousUser()
    return made


def item(header: str, name: str) -> dict[str, str]:
    """The parameters of one item of a RateLimit or RateLimit-Policy header: {'q': '2', 'w': '86400'}."""
    [found] = [part for part in header.split(", ") if part.startswith(f'"{name}";')]
    return dict(pair.split("=") for pair in found.split(";")[1:])


def quota(period="day", zone_name="Europe/Paris", **fields):
    return policy(strategy="calendar_quota", period=period, time_zone=zone_name, window=1, **fields)


# --- the headers ------------------------------------------------------------------------------------


def test_t_and_retry_after_are_the_wait_until_the_next_midnight_in_the_policys_zone():
    """Kiritimati is 14 hours ahead of UTC: its day ends at 10:00 UTC, which no 86,400 s window does."""
    @ratelimit(rate="2/calendar-day", key="header:x-api-key", time_zone="Pacific/Kiritimati", name="api-day")
    def view(request):
        return HttpResponse("ok")

    answers = [view(caller()) for _ in range(3)]
    here = datetime.now(ZoneInfo("Pacific/Kiritimati"))
    midnight = datetime.combine(here.date() + timedelta(days=1), datetime.min.time(), here.tzinfo)
    wait = (midnight - here).total_seconds()
    assert [a.status_code for a in answers] == [200, 200, 429]
    for answer in answers:
        assert abs(int(item(answer["RateLimit"], "api-day")["t"]) - wait) <= 2
        assert item(answer["RateLimit-Policy"], "api-day") == {"q": "2", "w": "86400"}
    assert abs(int(answers[2]["Retry-After"]) - wait) <= 2
    assert item(answers[2]["RateLimit"], "api-day")["r"] == "0"


@pytest.mark.parametrize(("day", "hours"), [("2026-03-29", 23), ("2026-10-25", 25), ("2026-07-14", 24)])
def test_w_is_the_length_of_a_dst_day_and_t_the_time_left_in_it(day, hours):
    limited = quota(limit=2)
    one = datetime.fromisoformat(f"{day}T01:00:00").replace(tzinfo=ZoneInfo("Europe/Paris"))  # before the change
    midnight = datetime.fromisoformat(f"{day}T00:00:00").replace(tzinfo=ZoneInfo("Europe/Paris")) + timedelta(days=1)
    verdicts = [engine.decide([check(limited)], now=one.timestamp()) for _ in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False]
    left = int((midnight.astimezone(timezone.utc) - one.astimezone(timezone.utc)).total_seconds())
    assert left == (hours - 1) * 3600  # the hour the clocks skip or repeat at 2 or 3 a.m. is in the wait
    response = HttpResponse()
    headers.apply(response, verdicts[2].decisions, verdicts[2].denied_by)
    assert item(response["RateLimit-Policy"], limited.name) == {"q": "2", "w": str(hours * 3600)}
    assert item(response["RateLimit"], limited.name) == {"r": "0", "t": str(left)}
    assert response["Retry-After"] == str(left)


# --- shadow mode and the deny cache -----------------------------------------------------------------------


def test_a_shadow_quota_counts_and_reports_but_never_refuses_nor_shows():
    make_policy(name="watch-month", action="api", strategy="calendar_quota", period="month", time_zone="UTC",
                limit=2, window=1, key="header:x-api-key", mode="shadow")
    verdicts = [ratelimit_app.hit(caller(), "api") for _ in range(4)]
    assert all(v.allowed for v in verdicts)
    assert [(v.decisions[0].count, v.decisions[0].exceeded) for v in verdicts] == [
        (1, False), (2, False), (2, True), (2, True)
    ]
    assert "watch-month" not in {u.policy for u in ratelimit_app.usage(caller())}
    response = HttpResponse()
    headers.apply(response, verdicts[3].decisions)
    assert "RateLimit" not in response


def test_a_customer_over_the_months_quota_is_refused_from_memory_and_let_in_when_it_is_raised():
    row = make_policy(name="api-month", action="api", strategy="calendar_quota", period="month", time_zone="UTC",
                      limit=3, window=1, key="header:x-api-key")
    assert [ratelimit_app.hit(caller(), "api").allowed for _ in range(4)] == [True, True, True, False]
    with count_round_trips() as trips:
        refused = [ratelimit_app.hit(caller(), "api") for _ in range(5)]
    assert trips == [0] and not any(v.allowed for v in refused)
    wait = refused[-1].decisions[0].retry_after
    now = datetime.now(timezone.utc)
    first_of_next = (now.replace(day=28) + timedelta(days=4)).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    assert abs(wait - (first_of_next - now).total_seconds()) <= 2  # from memory, still the time to the 1st
    assert ratelimit_app.hit(caller("k-other"), "api").allowed  # another key has its own month
    row.limit = 5
    row.full_clean()
    row.save()
    assert [ratelimit_app.hit(caller(), "api").allowed for _ in range(3)] == [True, True, False]


# --- eight processes, a quota and a window in one call --------------------------------------------------


def _hits(quota_policy, window_policy, start, results):
    start.wait()
    checks = [check(quota_policy, "header:x-api-key=" + KEY), check(window_policy, "header:x-api-key=" + KEY)]
    results.put(sum(engine.decide(checks, cost=3).allowed for _ in range(60)))


@pytest.mark.slow
@pytest.mark.parametrize(("quota_limit", "window_limit"), [(300, 240), (240, 300)])
def test_eight_processes_count_a_quota_and_a_window_all_or_nothing_with_costs(quota_limit, window_limit):
    """480 attempts of 3 units: exactly 80 admitted, by whichever limit is lower, and the other policy
    counted those 80 and none of the 400 refused."""
    monthly, hourly = quota(period="month", zone_name="UTC", limit=quota_limit), policy(limit=window_limit, window=3600)
    admitted = sum(in_processes(_hits, (monthly, hourly)))
    checks = [check(monthly, "header:x-api-key=" + KEY), check(hourly, "header:x-api-key=" + KEY)]
    counts = [d.count for d in engine.decide(checks, dry_run=True).decisions]
    print(f"quota {quota_limit}, window {window_limit}: {admitted} admitted of 480, counts {counts}")
    assert admitted == 80
    assert counts == [240, 240]


# --- the admin ---------------------------------------------------------------------------------------------


def change_form(row: Policy, **values) -> dict[str, str]:
    data = {
        "name": row.name, "action": row.action, "rate": "", "limit": str(row.limit), "window": str(row.window),
        "strategy": row.strategy, "period": row.period, "time_zone": row.time_zone, "key": row.key,
        "mode": row.mode, "enabled": "on", "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0",
    }
    return {**data, **values}


def test_the_change_page_edits_a_quotas_period_and_zone_and_the_next_decision_obeys(admin_client):
    row = make_policy(name="api-month", action="api", strategy="calendar_quota", period="month", time_zone="UTC",
                      limit=100, window=1, key="header:x-api-key")
    url = f"/admin/ratelimit_app/policy/{row.pk}/change/"
    answer = admin_client.post(url, change_form(row, period="week", time_zone="America/New_York"))
    assert answer.status_code == 302, answer.content.decode()[:3000]
    row.refresh_from_db()
    assert (row.period, row.time_zone, row.window) == ("week", "America/New_York", 7 * 86400)
    [decision] = ratelimit_app.hit(caller(), "api").decisions
    assert decision.window == 7 * 86400 and decision.policy.time_zone == "America/New_York"
    here = datetime.now(ZoneInfo("America/New_York"))
    monday = datetime.combine(here.date() - timedelta(days=here.weekday()) + timedelta(days=7), datetime.min.time(),
                              here.tzinfo)
    assert abs(decision.reset_in - (monday - here).total_seconds()) <= 2


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"time_zone": "Europe/Pariss"}, "time_zone", "&#x27;Europe/Pariss&#x27; is not a time zone"),
        ({"period": ""}, "period", "A calendar quota counts per day, week or month: choose one."),
        ({"strategy": "token_bucket", "window": "3600"}, "period", "token_bucket counts in a window of seconds, not"),
        ({"strategy": "sliding_window", "window": "60", "period": ""}, "time_zone", "sliding_window counts in a"),
    ],
)
def test_the_change_page_refuses_a_bad_zone_or_a_period_the_strategy_cannot_count(admin_client, values, field, message):
    row = make_policy(name="api-month", action="api", strategy="calendar_quota", period="month", time_zone="UTC",
                      limit=100, window=1, key="header:x-api-key")
    answer = admin_client.post(f"/admin/ratelimit_app/policy/{row.pk}/change/", change_form(row, **values))
    assert answer.status_code == 200
    assert message in answer.content.decode()
    assert field in answer.context["adminform"].form.errors
    row.refresh_from_db()
    assert (row.strategy, row.period, row.time_zone) == ("calendar_quota", "month", "UTC")  # nothing changed


# --- usage() when Redis lost the counters -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_usage_after_a_flushall_shows_what_was_saved_and_counts_nothing(redis_client):
    row = make_policy(name="api-month", action="api", strategy="calendar_quota", period="month", time_zone="UTC",
                      limit=100, window=1, key="header:x-api-key")
    for _ in range(3):
        assert ratelimit_app.hit(caller(), "api").allowed
    assert quotas.saver.save() == 1
    quotas.saver.discard()
    redis_client.flushall()
    for _ in range(2):  # looking twice: neither look counted
        [shown] = [u for u in ratelimit_app.usage(caller()) if u.policy == "api-month"]
        assert (shown.used, shown.remaining) == (3, 97)
    assert ratelimit_app.hit(caller(), "api").decisions[0].count == 4  # the period goes on from the saved 3


# --- a calendar period where a window of seconds is expected -----------------------------------------------


@pytest.mark.parametrize("rate", ["10000/months", "10000/1month", "500/weeks", "100/mo"])
def test_a_calendar_period_misspelt_or_where_only_windows_go_says_how_a_quota_is_written(rate):
    from django.core.exceptions import ImproperlyConfigured

    from ratelimit_app.compat.django_ratelimit import get_usage
    from ratelimit_app.rates import parse_rate
    from ratelimit_app.registry import code_policy

    said = "A calendar quota is written 10000/month, 500/week or 1000/calendar-day"
    with pytest.raises(ValueError, match=said):
        parse_rate(rate)
    with pytest.raises(ImproperlyConfigured, match=said):
        code_policy("misspelt", action="*", origin="@ratelimit", rate=rate)
    with pytest.raises(ImproperlyConfigured, match=said):  # django-ratelimit's door counts windows only
        get_usage(caller(), group="g", key="ip", rate="5/month", increment=True)


# --- what the operator reads -------------------------------------------------------------------------------


def test_the_tester_the_live_page_and_the_cli_name_a_quotas_calendar_period_not_its_31_days(admin_client, capsys):
    from django.core.management import call_command
    from django.urls import reverse

    from ratelimit_app.models import Plan, PlanAssignment, PlanLimit

    row = make_policy(name="search-month", action="demo:search", strategy="calendar_quota", period="month",
                      time_zone="Europe/Paris", limit=100, window=1, key="ip")
    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=row, limit=1000)
    PlanAssignment.objects.create(plan=pro, kind="ip", network="203.0.113.9")
    month = "calendar month (Europe/Paris)"
    tester = admin_client.post(reverse("admin:ratelimit_app_policy_tester"),
                               {"method": "GET", "path": "/demo/search/", "ip": "203.0.113.9"}).content.decode()
    assert f"<td>1000 / {month}</td>" in tester
    live = admin_client.get(reverse("admin:ratelimit_app_policy_live", args=[row.pk])).content.decode()
    assert f"pro</a>: 1000 / {month}" in live
    call_command("ratelimit", "test", "GET", "/demo/search/", "--ip", "203.0.113.9")
    call_command("ratelimit", "status")
    call_command("ratelimit", "top", "search-month")
    out = capsys.readouterr().out
    assert f"1000 / {month}" in out and f"100 / {month}" in out and f"search-month: 100 / {month}, " in out
    assert "/ 31 d" not in tester + live + out and "2678400 s" not in tester + live + out


# --- resets -----------------------------------------------------------------------------------------------


def monthly_per_key(limit: int = 10) -> Policy:
    return make_policy(name="api-month", action="api", strategy="calendar_quota", period="month", time_zone="UTC",
                       limit=limit, window=1, key="header:x-api-key")


def used_now(key: str = KEY) -> int:
    return ratelimit_app.hit(caller(key), "api").decisions[0].count


@pytest.mark.django_db(transaction=True)
def test_a_reset_subject_starts_the_period_afresh_until_redis_loses_its_counter(redis_client):
    from ratelimit_app import operations
    from ratelimit_app.models import QuotaUsage

    row = monthly_per_key()
    assert [used_now() for _ in range(5)] == [1, 2, 3, 4, 5]
    quotas.saver.save()
    shown, had = operations.reset_subject(row, f"header:X-Api-Key={KEY}")
    assert had
    assert used_now() == 1  # not the saved 5 taken back: the reset holds
    quotas.saver.save()
    assert QuotaUsage.objects.get().used == 5  # what was used stays for billing
    quotas.saver.discard()
    redis_client.flushall()  # a loss of Redis afterwards starts again from the saved usage
    assert used_now() == 6


@pytest.mark.django_db(transaction=True)
def test_reset_all_starts_every_subject_of_a_quota_afresh(redis_client):
    from ratelimit_app import operations
    from ratelimit_app.models import QuotaUsage

    row = monthly_per_key()
    assert [used_now("k-saved") for _ in range(4)][-1] == 4
    quotas.saver.save()
    assert [used_now("k-pending") for _ in range(3)][-1] == 3  # counted by this worker, not saved yet
    operations.reset_all(row)
    assert [used_now("k-saved"), used_now("k-pending"), used_now("k-new")] == [1, 1, 1]
    # the current period's saved usage went with the counts, and what was pending before is stale
    quotas.saver.save()
    assert sorted(QuotaUsage.objects.values_list("used", flat=True)) == [1, 1, 1]


def test_usage_without_redis_raises_redis_unavailable(server, outage_forgotten):
    from ratelimit_app.engine import RedisUnavailable

    monthly_per_key()
    assert [u.used for u in ratelimit_app.usage(caller()) if u.policy == "api-month"] == [0]
    server.stop()
    with pytest.raises(RedisUnavailable):
        ratelimit_app.usage(caller())


# --- RATELIMIT_POLICIES ------------------------------------------------------------------------------------


def test_a_quota_in_the_settings_counts_by_its_zones_calendar_and_a_bad_zone_is_reported_by_the_checks(settings):
    from django.core.checks import run_checks

    from ratelimit_app.registry.declarations import settings_policies

    per_key = {"action": "api", "key": "header:x-api-key"}
    settings.RATELIMIT_POLICIES = [
        {"name": "api-month", "rate": "1000/month", "time_zone": "Asia/Tokyo", **per_key},
        {"name": "api-week", "rate": "50/week", "time_zone": "Mars/Olympus", **per_key},
    ]
    [declared] = settings_policies([])
    assert {k: declared.values[k] for k in ("strategy", "period", "time_zone", "limit")} == {
        "strategy": "calendar_quota", "period": "month", "time_zone": "Asia/Tokyo", "limit": 1000
    }
    [error] = [m for m in run_checks() if m.id == "ratelimit_app.E010"]
    assert "RATELIMIT_POLICIES[1] (api-week)" in error.msg and "'Mars/Olympus' is not a time zone" in error.msg
    [decision] = ratelimit_app.hit(caller(), "api").decisions
    assert (decision.policy.name, decision.policy.time_zone, decision.count) == ("api-month", "Asia/Tokyo", 1)


@pytest.mark.django_db(transaction=True)
def test_reset_all_of_an_invalid_quota_row_still_moves_its_generation_on(redis_client):
    from ratelimit_app import operations

    row = monthly_per_key()
    Policy.objects.filter(pk=row.pk).update(time_zone="Europe/Atlantis")  # past the form
    row.refresh_from_db()
    operations.reset_all(row)
    row.refresh_from_db()
    assert row.generation == 1


# --- billing: finding a customer's rows ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_subject_key_finds_the_saved_usage_of_an_api_key_shown_masked():
    from ratelimit_app.models import QuotaUsage

    monthly_per_key()
    secret = "sk_live_0123456789abcdef"
    for _ in range(3):
        ratelimit_app.hit(caller(secret), "api")
    ratelimit_app.hit(caller("sk_live_other"), "api")
    quotas.saver.save()
    found = ratelimit_app.subject_key("api-month", f"header:X-Api-Key={secret}")
    row = QuotaUsage.objects.get(subject=found)
    assert row.used == 3 and secret not in row.display
    with pytest.raises(ValueError, match="no policy 'nowhere'"):
        ratelimit_app.subject_key("nowhere", f"header:X-Api-Key={secret}")
    with pytest.raises(ValueError):
        ratelimit_app.subject_key("api-month", "ip:203.0.113.9")  # not the policy's key


@pytest.mark.django_db(transaction=True)
async def test_ausage_after_a_flushall_shows_what_was_saved(redis_client):
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(monthly_per_key)()
    for _ in range(2):
        assert (await ratelimit_app.ahit(caller(), "api")).allowed
    assert await sync_to_async(quotas.saver.save)() == 1
    quotas.saver.discard()
    redis_client.flushall()
    [shown] = [u for u in await ratelimit_app.ausage(caller()) if u.policy == "api-month"]
    assert (shown.used, shown.remaining) == (2, 8)
    await sync_to_async(connections.close_all)()  # the executor thread's, or PostgreSQL keeps the test database
