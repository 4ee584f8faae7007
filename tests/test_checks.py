"""`manage.py check` reports a middleware order that silently disables policies counted per user."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.management import call_command

from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

SESSIONS = "django.contrib.sessions.middleware.SessionMiddleware"
AUTHENTICATION = "django.contrib.auth.middleware.AuthenticationMiddleware"
RATELIMIT = "ratelimit_app.middleware.RateLimitMiddleware"


def middleware_warnings() -> list:
    return [message for message in run_checks() if message.id == "ratelimit_app.W004"]


@pytest.mark.parametrize(
    "middleware",
    [[SESSIONS, RATELIMIT, AUTHENTICATION], [SESSIONS, RATELIMIT]],
    ids=["before-authentication", "without-authentication"],
)
@pytest.mark.parametrize("key", ["user", "user_or_ip", "ip,user"])
def test_rate_limit_middleware_before_authentication_is_reported_when_a_policy_counts_users(settings, middleware, key):
    make_policy(name="per-user", key=key)
    settings.MIDDLEWARE = middleware
    warnings = middleware_warnings()
    assert len(warnings) == 1
    assert "per-user" in warnings[0].msg
    assert "right after" in warnings[0].hint


def test_the_order_the_readme_gives_is_not_reported(settings):
    make_policy(name="per-user", key="user")
    settings.MIDDLEWARE = [SESSIONS, AUTHENTICATION, RATELIMIT]
    assert middleware_warnings() == []


def test_a_wrong_order_without_policies_counting_users_is_not_reported(settings):
    make_policy(name="per-ip", key="ip")
    make_policy(name="per-user-disabled", key="user", enabled=False)
    settings.MIDDLEWARE = [SESSIONS, RATELIMIT, AUTHENTICATION]
    assert middleware_warnings() == []


def test_the_warning_shows_in_manage_py_check(settings, capsys):
    make_policy(name="per-user", key="user")
    middleware = [path for path in settings.MIDDLEWARE if path != RATELIMIT]
    middleware.insert(middleware.index(AUTHENTICATION), RATELIMIT)  # the demo's list, one step wrong
    settings.MIDDLEWARE = middleware
    call_command("check")
    assert "ratelimit_app.W004" in capsys.readouterr().err


def test_the_django_ratelimit_guides_settings_pasted_into_a_project_of_django_ratelimit_pass_check(settings):
    """A django-ratelimit project most often keeps its counters in a django-redis cache at database 0."""
    guide = (Path(__file__).parent.parent / "docs" / "howto" / "migrate-django-ratelimit.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if b.startswith("# settings.py\n")]
    project = {
        "INSTALLED_APPS": [], "MIDDLEWARE": [AUTHENTICATION], "RATELIMIT_USE_CACHE": "default",
        "CACHES": {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/0"}},
    }
    exec(block, project)  # what the reader pastes at the end of settings.py
    settings.CACHES, settings.RATELIMIT_CACHE = project["CACHES"], project["RATELIMIT_CACHE"]
    assert [(m.id, m.msg) for m in run_checks() if m.id.startswith("ratelimit_app.")] == []
