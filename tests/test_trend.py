"""Trends: allowed and denied per window over the last hour (or 60 windows), on the live page (JSON and
chart) and as a sparkline of denials in the policy list."""

from __future__ import annotations

import re
import time

import pytest
from django.urls import reverse

from ratelimit_app import live
from ratelimit_app.engine import keys
from ratelimit_app.policies import compile_policy
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


def write_totals(redis_client, policy, windows_ago: int, allowed: int, denied: int, now: float | None = None) -> None:
    """What the decide script keeps of a past window: its allowed and denied rolled up in the totals."""
    number = int((now or time.time()) * 1000) // (policy.window * 1000) - windows_ago
    name = keys.totals_key(compile_policy(policy), 0)  # one shard
    redis_client.hset(name, mapping={f"A{number}": allowed, f"D{number}": denied})
    redis_client.expire(name, 3600 + policy.window)


def search(client, ip=IP, times=1):
    return [client.get("/demo/search/?q=a", REMOTE_ADDR=ip).status_code for _ in range(times)]


@pytest.fixture(autouse=True)
def away_from_a_window_boundary():
    """The tests write and read windows of 60 s; starting just before a boundary would shift them by one."""
    left = 60 - time.time() % 60
    if left < 3:
        time.sleep(left + 0.1)


@pytest.fixture
def policy():
    return make_policy(name="search-per-ip", action="demo:search", limit=3, window=60, key="ip")


@pytest.mark.parametrize("window, windows", [(1, 60), (60, 60), (90, 40), (300, 12), (3600, 2), (86400, 2)])
def test_a_trend_covers_60_windows_or_the_last_hour_whichever_is_fewer(window, windows):
    assert live.trend_windows(window) == windows


def test_trend_reads_each_window_oldest_first_with_gaps_as_zero(redis_client, client, policy):
    now = time.time()
    write_totals(redis_client, policy, 59, allowed=7, denied=2, now=now)
    write_totals(redis_client, policy, 3, allowed=4, denied=0, now=now)
    write_totals(redis_client, policy, 60, allowed=99, denied=99, now=now)  # older than the trend: left out
    search(client, times=5)  # the current window, counted by the request path itself
    trend = live.policy_trend(policy)
    assert len(trend) == 60
    assert [(p.allowed, p.denied) for p in trend if p.allowed or p.denied] == [(7, 2), (4, 0), (3, 2)]
    assert (trend[0].allowed, trend[56].allowed) == (7, 4)
    assert [b.start - a.start for a, b in zip(trend, trend[1:])] == [60] * 59
    assert trend[-1].start <= time.time() < trend[-1].start + 60


def test_live_json_has_the_trend_and_its_last_window_is_the_current_totals(admin_client, client, redis_client, policy):
    write_totals(redis_client, policy, 10, allowed=20, denied=5)
    search(client, times=4)
    data = admin_client.get(reverse("admin:ratelimit_app_policy_live", args=[policy.pk]) + "?format=json").json()
    assert len(data["trend"]) == 60
    assert set(data["trend"][0]) == {"start", "allowed", "denied"}
    assert {k: data["trend"][-1][k] for k in ("allowed", "denied")} == data["totals"] == {"allowed": 3, "denied": 1}
    assert {k: data["trend"][-11][k] for k in ("allowed", "denied")} == {"allowed": 20, "denied": 5}


def test_live_page_has_the_chart_inline(admin_client, policy):
    html = admin_client.get(reverse("admin:ratelimit_app_policy_live", args=[policy.pk])).content.decode()
    assert '<svg id="rl-trend"' in html and "renderTrend(data.trend" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # no external assets


def test_policy_list_shows_a_sparkline_of_denials(admin_client, client, redis_client, policy):
    quiet = make_policy(name="quiet", action="/nothing/", limit=3, window=60, key="ip")
    write_totals(redis_client, policy, 30, allowed=3, denied=6)
    search(client, times=5)
    html = admin_client.get(reverse("admin:ratelimit_app_policy_changelist")).content.decode()
    sparklines = re.findall(r'<svg class="rl-spark".*?<title>(.*?)</title><polyline points="(.*?)"', html)
    by_title = dict(sparklines)
    assert {"8 denied in the last 1 h", "0 denied in the last 1 h"} <= set(by_title)  # (and any policy from code)
    points = [float(xy.split(",")[1]) for xy in by_title["8 denied in the last 1 h"].split()]
    assert len(points) == 60 and min(points) == points[29]  # the highest denials draw the highest point
    assert quiet.name in html


def test_policy_list_without_redis_shows_no_sparkline_and_still_answers(admin_client, policy, settings):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    response = admin_client.get(reverse("admin:ratelimit_app_policy_changelist"))
    assert response.status_code == 200
    assert 'class="rl-spark"' not in response.content.decode()
    data = admin_client.get(reverse("admin:ratelimit_app_policy_live", args=[policy.pk]) + "?format=json").json()
    assert data["trend"] == [] and "Redis is unreachable" in data["error"]


@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_window", "sliding_log", "token_bucket"])
def test_windows_that_ended_stay_in_the_trend_as_decided(strategy):
    from ratelimit_app import engine
    from tests.helpers import check
    from tests.helpers import policy as compiled_policy

    limited = compiled_policy(strategy=strategy, limit=3, window=60)
    start = (int(time.time()) // 60 - 5) * 60  # five windows ago, on a window's start
    for offset in (1, 2, 3, 4, 5):  # 3 admitted, 2 refused
        engine.decide([check(limited)], now=start + offset)
    for offset in (61, 62):  # the next window
        engine.decide([check(limited, "ip:198.51.100.1")], now=start + offset)
    engine.decide([check(limited, "ip:198.51.100.2")], now=start + 200)  # later: the buckets roll up
    trend = live.policy_trend(limited, now=start + 250)
    by_start = {point.start: (point.allowed, point.denied) for point in trend}
    assert by_start[start] == (3, 2)
    assert by_start[start + 60] == (2, 0)
    assert by_start[start + 180] == (1, 0)
    assert sum(point.allowed for point in trend) == 6
