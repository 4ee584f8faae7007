"""The live page in a real browser (Debian's chromium, headless): counts change without a reload."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By

from ratelimit_app import engine
from ratelimit_app.models import Policy
from ratelimit_app.policies import compile_policy
from tests.helpers import check

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "live.png"


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> tuple[str | None, str | None]:
    binary = next(filter(None, map(shutil.which, BROWSERS)), None)
    return binary, shutil.which("chromedriver")


@pytest.fixture
def browser():
    binary, driver = find_chromium()
    if not (binary and driver):
        missing = " and ".join(name for name, found in (("chromium", binary), ("chromedriver", driver)) if not found)
        reason = f"{missing} not found (apt-get install chromium chromium-driver; make test does it as root)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"The browser test is required in CI: {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,900"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    yield chrome
    chrome.quit()


def open_live_page(browser, live_server, policy) -> None:
    """Log in as the admin user and open the policy's live page, marking the page to detect a reload."""
    browser.get(live_server.url + "/admin/login/?next=/admin/ratelimit_app/policy/%d/live/" % policy.pk)
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: "Live usage" in browser.title)
    browser.execute_script("window.notReloaded = true")


def wait_for(condition, timeout=30.0, shows=None):
    """`condition`'s value once true; `shows`: what the failure says the page showed (a loaded machine draws late)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except StaleElementReferenceException:
            value = None  # the page redrew what was being read (it refreshes every second): read again
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("the page did not change in time" + (f": it shows {shows()!r}" if shows else ""))


def test_live_page_updates_counts_without_reloading(browser, live_server, admin_user):
    policy = Policy(name="search-per-ip", action="demo:search", limit=5, window=60, strategy="sliding_window", key="ip")
    policy.full_clean()
    policy.save()
    compiled = compile_policy(policy)

    open_live_page(browser, live_server, policy)
    assert "No subject has used this policy" in browser.find_element(By.ID, "rl-subjects").text

    for i, times in enumerate((6, 3, 1)):  # made in the background of the open page
        for _ in range(times):
            engine.decide([check(compiled, f"ip:198.51.100.{i + 1}")])

    wait_for(lambda: browser.find_element(By.ID, "rl-active").text == "3")
    rows = browser.find_elements(By.CSS_SELECTOR, "#rl-subjects tbody tr")
    assert [row.find_elements(By.TAG_NAME, "td")[0].text for row in rows] == [
        "ip:198.51.100.1", "ip:198.51.100.2", "ip:198.51.100.3",
    ]
    assert "blocked" in rows[0].text
    assert browser.find_element(By.ID, "rl-denied").text == "1"
    assert browser.execute_script("return window.notReloaded") is True

    engine.decide([check(compiled, "ip:198.51.100.3")])
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#rl-subjects tbody tr")[2].find_elements(By.TAG_NAME, "td")[1].text == "2")
    assert browser.execute_script("return window.notReloaded") is True
    if os.environ.get("SAVE_SCREENSHOT"):  # refresh docs/live.png: SAVE_SCREENSHOT=1 make test
        browser.save_screenshot(str(SCREENSHOT))


def log_in(browser, live_server, next_path: str) -> None:
    browser.get(f"{live_server.url}/admin/login/?next={next_path}")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()


def test_the_policy_form_offers_the_usual_units_and_saves_one_typed_in(browser, live_server, admin_user):
    log_in(browser, live_server, "/admin/ratelimit_app/policy/add/")
    unit = wait_for(lambda: browser.find_element(By.ID, "id_unit"))
    assert unit.get_attribute("value") == "requests"  # what a policy counts unless told
    offered = browser.execute_script("return [...arguments[0].list.options].map(o => o.value)", unit)
    assert offered == ["requests", "content-bytes", "tokens", "credits"]
    for field, value in (("id_name", "chat-tokens"), ("id_action", "chat"), ("id_rate", "20000/m")):
        browser.find_element(By.ID, field).send_keys(value)
    unit.clear()
    unit.send_keys("tokens")
    browser.find_element(By.NAME, "_save").click()
    wait_for(lambda: "was added successfully" in browser.page_source)
    assert Policy.objects.get(name="chat-tokens").unit == "tokens"
    assert "20,000 tokens / 1 min" in browser.find_element(By.ID, "result_list").text


def test_the_live_page_counts_a_metered_policy_in_its_unit_and_shows_debt_without_reloading(
    browser, live_server, admin_user
):
    from tests.helpers import settled

    policy = Policy(name="chat-tokens", action="chat", limit=20_000, window=60, strategy="fixed_window", key="ip",
                    unit="tokens")
    policy.full_clean()
    policy.save()
    compiled = compile_policy(policy)
    engine.decide([check(compiled, "ip:198.51.100.1")], cost=7_412)

    open_live_page(browser, live_server, policy)
    header = browser.find_elements(By.CSS_SELECTOR, "#rl-subjects thead th")[1].text
    assert header.lower() == "tokens"  # the admin's stylesheet sets headers in capitals (drawn by the server)
    def cells() -> list[str]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#rl-subjects tbody tr")
        return [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")] if rows else []

    wait_for(lambda: cells()[1:4] == ["7,412", "20,000", "12,588"], shows=cells)  # the page's script draws the rows

    settled(compiled, "ip:198.51.100.1", used=13_088, estimate=100)  # a settle beyond what was left: debt
    wait_for(lambda: cells()[1] == "20,500", shows=cells)
    assert cells()[3] == "0" and cells()[5] == "blocked, 500 tokens over"
    assert browser.execute_script("return window.notReloaded") is True
