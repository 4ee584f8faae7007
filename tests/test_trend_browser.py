"""The live page's trend chart in a real browser (Debian's chromium, headless): drawn inline, and
redrawn with the page's refresh."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from ratelimit_app import engine
from ratelimit_app.policies import compile_policy
from tests.helpers import check, make_policy
from tests.test_admin_browser import browser, open_live_page, wait_for  # noqa: F401  (the fixture and the helpers)
from tests.test_trend import write_totals

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "trend.png"


def points(browser) -> list[tuple[int, int]]:
    # read in one script: the chart is redrawn every second, elements found earlier go stale
    return [tuple(point) for point in browser.execute_script(
        "return [...document.querySelectorAll('#rl-trend g.rl-point')].map(g => [+g.dataset.allowed, +g.dataset.denied])"
    )]


def bar(browser, index: int) -> dict:
    """The drawn bars and the hover text of one window."""
    return browser.execute_script(
        "const g = document.querySelectorAll('#rl-trend g.rl-point')[arguments[0]];"
        "const rects = g.querySelectorAll('rect');"
        "return {allowed: +rects[0].getAttribute('height'), denied: +rects[1].getAttribute('height'),"
        " classes: [rects[0].getAttribute('class'), rects[1].getAttribute('class')],"
        " title: g.querySelector('title').textContent}", index,
    )


def test_trend_chart_shows_past_windows_and_follows_the_current_one(browser, live_server, admin_user, redis_client):
    left = 60 - time.time() % 60
    if left < 8:  # the page must stay in one window of 60 s while it is watched
        time.sleep(left + 0.1)
    policy = make_policy(name="search-per-ip", action="demo:search", limit=2, window=60, key="ip")
    write_totals(redis_client, policy, 20, allowed=30, denied=12)
    for windows_ago, allowed, denied in ((50, 8, 0), (45, 14, 0), (35, 22, 3), (30, 26, 7), (25, 18, 1), (10, 9, 0), (5, 12, 0)):
        write_totals(redis_client, policy, windows_ago, allowed=allowed, denied=denied)

    open_live_page(browser, live_server, policy)

    drawn = wait_for(lambda: points(browser))
    assert len(drawn) == 60 and drawn[39] == (30, 12) and drawn[-1] == (0, 0)
    assert "1 h (60 windows of 1 min)" in browser.find_element(By.ID, "rl-trend-span").text
    drawn_bar = bar(browser, 39)
    assert drawn_bar["classes"] == ["rl-allowed", "rl-denied"]
    assert drawn_bar["allowed"] > drawn_bar["denied"] > 0  # 30 over 12, drawn to scale
    assert drawn_bar["title"].endswith(": 30 allowed, 12 denied")

    compiled = compile_policy(policy)
    for _ in range(5):  # made in the background of the open page
        engine.decide([check(compiled, "ip:198.51.100.1")])
    wait_for(lambda: points(browser)[-1] == (2, 3))
    assert browser.execute_script("return window.notReloaded") is True
    if os.environ.get("SAVE_SCREENSHOT"):  # refresh docs/trend.png: SAVE_SCREENSHOT=1 make test
        browser.find_element(By.ID, "rl-trend-module").screenshot(str(SCREENSHOT))
