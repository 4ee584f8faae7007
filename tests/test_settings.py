"""Every setting is read by its kind (conf.TYPES): the forms people write are read (a number or a boolean as a
string from os.environ, a list as a comma-separated string), anything else is reported by system check E021
and, where checks do not run, gives way to the default with a logged error: no request, no timer thread fails."""

from __future__ import annotations

import logging
import re
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ratelimit_app import checks as system_checks
from ratelimit_app import engine, quotas
from ratelimit_app.conf import DEFAULTS, TYPES, get_setting
from ratelimit_app.models import QuotaUsage
from ratelimit_app.policies import compile_policy
from tests.cluster import wait_for
from tests.helpers import check, make_policy

# one value of the wrong kind (or out of range) for every setting: a setting added to DEFAULTS fails
# test_every_setting_has_a_wrong_value_here until it has one
WRONG = {
    "RATELIMIT_ENABLED": "perhaps",
    "RATELIMIT_CACHE_BYTES": "32MB",
    "RATELIMIT_CACHE": ["default"],
    "RATELIMIT_KEY_PREFIX": 5,
    "RATELIMIT_TRUSTED_PROXIES": 10,
    "RATELIMIT_IPV4_PREFIX": 33,
    "RATELIMIT_IPV6_PREFIX": "64 bits",
    "RATELIMIT_PLAIN_HEADERS": ["User-Agent", 5],
    "RATELIMIT_FAIL_OPEN": "maybe",
    "RATELIMIT_BREAKER_SECONDS": "one",
    "RATELIMIT_POLICY_RECHECK_SECONDS": -1,
    "RATELIMIT_POLICY_RELOAD_SECONDS": [30],
    "RATELIMIT_ADMIN_TIMEOUT": 0,
    "RATELIMIT_LIVE_INDEX_SIZE": 0,
    "RATELIMIT_SHARDS": "16 shards",
    "RATELIMIT_QUOTA_SAVE_SECONDS": "5s",
    "RATELIMIT_DENIED_VIEW": "tests.no_such_module.denied",
    "RATELIMIT_DENY_CACHE": "sometimes",
    "RATELIMIT_METRICS": 2,
    "RATELIMIT_POLICIES": {"name": "api", "action": "/api/", "rate": "100/m"},
    "RATELIMIT_REDIS_FUNCTIONS": "functions",
}

# what people write, from os.environ above all, and what the app reads it as
WRITTEN = [
    ("RATELIMIT_QUOTA_SAVE_SECONDS", "1", 1.0),
    ("RATELIMIT_BREAKER_SECONDS", " 0.5 ", 0.5),
    ("RATELIMIT_POLICY_RECHECK_SECONDS", "0", 0.0),
    ("RATELIMIT_POLICY_RELOAD_SECONDS", 60, 60.0),
    ("RATELIMIT_ADMIN_TIMEOUT", "0.25", 0.25),
    ("RATELIMIT_IPV4_PREFIX", "24", 24),
    ("RATELIMIT_IPV6_PREFIX", "48", 48),
    ("RATELIMIT_LIVE_INDEX_SIZE", "500", 500),
    ("RATELIMIT_SHARDS", "16", 16),
    ("RATELIMIT_ENABLED", "false", False),
    ("RATELIMIT_FAIL_OPEN", "0", False),
    ("RATELIMIT_FAIL_OPEN", "True", True),
    ("RATELIMIT_DENY_CACHE", "off", False),
    ("RATELIMIT_METRICS", "no", False),
    ("RATELIMIT_REDIS_FUNCTIONS", "false", False),
    ("RATELIMIT_REDIS_FUNCTIONS", True, "auto"),
    ("RATELIMIT_TRUSTED_PROXIES", "10.0.0.1, 10.0.0.0/8", ("10.0.0.1", "10.0.0.0/8")),
    ("RATELIMIT_PLAIN_HEADERS", ["X-Customer"], ("X-Customer",)),
    ("RATELIMIT_DENIED_VIEW", "tests.test_middleware.custom_denial", "tests.test_middleware.custom_denial"),
    ("RATELIMIT_POLICIES", None, ()),
]


def e021(name: str) -> list[str]:
    return [message.msg for message in system_checks.check_settings() if message.id == "ratelimit_app.E021"
            and message.msg.startswith(f"{name} is ")]


def test_every_setting_has_its_kind_beside_its_default():
    assert sorted(TYPES) == sorted(DEFAULTS), "conf.TYPES must give the kind of every setting of conf.DEFAULTS"


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_every_default_is_read_as_itself(name):
    assert TYPES[name].read(DEFAULTS[name]) == DEFAULTS[name]


def test_every_setting_has_a_wrong_value_here():
    assert sorted(WRONG) == sorted(DEFAULTS)


def test_the_defaults_pass_the_check():
    assert system_checks.check_settings() == []


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_a_setting_of_the_wrong_kind_is_reported_by_e021_naming_it_and_what_it_must_be(settings, name):
    setattr(settings, name, WRONG[name])
    [message] = e021(name)
    assert repr(WRONG[name]) in message and TYPES[name].expected in message
    assert [m.id for m in system_checks.check_settings()] == ["ratelimit_app.E021"]  # that setting's alone


@pytest.mark.parametrize("name, value, read", WRITTEN, ids=[f"{name}={value!r}" for name, value, read in WRITTEN])
def test_what_people_write_is_read_as_documented(settings, name, value, read):
    setattr(settings, name, value)
    assert e021(name) == []
    assert get_setting(name) == read


@pytest.mark.django_db
def test_manage_py_check_reports_a_wrong_setting(settings):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = "every 5 seconds"
    with pytest.raises(SystemCheckError, match="RATELIMIT_QUOTA_SAVE_SECONDS is 'every 5 seconds'"):
        call_command("check")


@pytest.mark.parametrize("shards", [0, -3, 20000])
def test_a_shard_count_out_of_range_is_e016_not_e021(settings, shards):
    settings.RATELIMIT_SHARDS = shards
    assert [m.id for m in system_checks.check_shards()] == ["ratelimit_app.E016"]
    assert e021("RATELIMIT_SHARDS") == []


def test_a_wrong_setting_gives_way_to_its_default_with_a_logged_error(settings, caplog):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = "5s"
    with caplog.at_level(logging.ERROR, logger="ratelimit_app"):
        assert get_setting("RATELIMIT_QUOTA_SAVE_SECONDS") == 5.0
        assert get_setting("RATELIMIT_QUOTA_SAVE_SECONDS") == 5.0
    [logged] = [r.getMessage() for r in caplog.records if "RATELIMIT_QUOTA_SAVE_SECONDS" in r.getMessage()]
    assert "'5s'" in logged and "default 5.0" in logged  # once: the value read is kept until settings change


@pytest.mark.django_db
def test_requests_are_limited_as_by_default_when_every_setting_is_wrong(settings, client):
    make_policy(name="search-per-ip", action="demo:search", limit=2)
    for name, value in WRONG.items():
        setattr(settings, name, value)
    answers = [client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)]
    assert answers == [200, 200, 429]


# --- the saver's timer --------------------------------------------------------------------------------


def monthly():
    return compile_policy(make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC",
                                      limit=100, window=1))


@pytest.mark.django_db(transaction=True)
def test_a_save_interval_written_as_a_string_saves_on_the_timer(settings):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = "0.1"  # as os.environ gives it
    limited = monthly()
    assert all(engine.decide([check(limited, f"ip:10.0.0.{n}")]).allowed for n in range(3))
    try:
        wait_for(lambda: QuotaUsage.objects.count() == 3, 10, "the usage to be saved")
    finally:
        print(f"interval '0.1': {QuotaUsage.objects.count()} of 3 rows saved")  # was 0: the timer thread died


@pytest.mark.django_db(transaction=True)
def test_a_timer_whose_thread_died_is_replaced_by_the_next_count(settings):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 0.1
    died = threading.Timer(0, lambda: None)  # a timer thread that ended without saving
    died.start()
    died.join()
    quotas.saver._timer = died
    assert engine.decide([check(monthly())]).allowed
    wait_for(lambda: QuotaUsage.objects.count() == 1, 10, "the usage to be saved")  # was never


def test_the_settings_reference_says_each_settings_kind():
    from tests.test_docs import reference

    text = reference("settings.md")
    missing = [name for name in DEFAULTS if not re.search(rf"^## `{name}`\n\nDefault: `.*`\n\nKind: ", text, re.M)]
    assert missing == [], "docs/reference/settings.md leaves out the kind of these settings"
