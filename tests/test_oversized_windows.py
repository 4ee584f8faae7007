"""A window longer than a year is refused at once, with a clear message, wherever it is written (a rate
string, the admin, the decorator, RATELIMIT_POLICIES, an import, a raw row), and never hangs a worker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.exceptions import ValidationError

from ratelimit_app.models import Policy
from ratelimit_app.rates import MAX_WINDOW
from ratelimit_app.strategies.sliding_window import BUCKET_CEILING, MAX_BUCKETS, default_bucket_size
from ratelimit_app.rates import parse_rate
from tests.servers import ROOT, manage, site_env

pytestmark = pytest.mark.django_db

ENDLESS = "5/99999999999999999d"  # spun a worker at 100% CPU until killed
# A timeout here detects a hang; it is no timing assertion: the command must end, with its message.
HANG = 90


@pytest.mark.parametrize(
    "rate", ["5/367d", "5/11574d", ENDLESS, (5, MAX_WINDOW + 1), (5, 10**20), "5/" + "9" * 5000 + "s"]
)
def test_parse_rate_refuses_a_period_longer_than_a_year(rate):
    with pytest.raises(ValueError, match="at most one year"):
        parse_rate(rate)


def test_parse_rate_accepts_a_period_of_one_year():
    assert parse_rate("5/366d") == (5, MAX_WINDOW)


def test_parse_rate_refuses_a_limit_too_long_to_read():
    with pytest.raises(ValueError, match="too large"):
        parse_rate("9" * 5000 + "/m")


def slow_default_bucket_size(window: int) -> int | None:
    """The rule as first written: every divisor of the window, one by one."""
    sizes = [size for size in range(1, window // 2 + 1) if window % size == 0 and window // size <= BUCKET_CEILING]
    return next((size for size in sizes if window // size <= MAX_BUCKETS), sizes[-1] if sizes else None)


@pytest.mark.parametrize("windows", [range(1, 3000), [3600, 86400, 7 * 86400, 86400 * 30, 6007, 6011 * 2, 600 * 7919]])
def test_default_bucket_size_keeps_its_rule(windows):
    assert [default_bucket_size(w) for w in windows] == [slow_default_bucket_size(w) for w in windows]


def test_default_bucket_size_answers_for_any_window():
    # bounded by the bucket count, not by the window: an absurd window is answered like any other
    assert default_bucket_size(10**17) == 10**17 // 50


def test_an_oversized_window_is_refused_by_the_model():
    policy = Policy(name="long", action="*", limit=5, window=MAX_WINDOW + 1, strategy="sliding_window", key="ip")
    with pytest.raises(ValidationError) as refused:
        policy.full_clean()
    assert "at most one year" in str(refused.value.message_dict["window"])
    assert policy.bucket_size is None  # nothing was computed from the window


def test_the_admin_rate_field_refuses_an_oversized_period_and_saves_nothing(admin_client):
    page = admin_client.post(
        "/admin/ratelimit_app/policy/add/",
        {"name": "long", "action": "*", "rate": "5/11574d", "strategy": "sliding_window", "key": "ip",
         "mode": "enforce", "enabled": "on", "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0"},
    )
    assert page.status_code == 200
    assert "at most one year" in " ".join(page.context["adminform"].form.errors.get("rate", []))
    assert not Policy.objects.filter(name="long").exists()


# --- through the real commands and settings, in processes of their own (a hang cannot stop the suite)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    env = site_env(tmp_path_factory.mktemp("oversized") / "db.sqlite3")
    manage(env, "migrate", "--noinput")
    return env


def run(env: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG)


@pytest.mark.slow
@pytest.mark.parametrize("fields", [{"rate": ENDLESS}, {"limit": 5, "window": 2**31 - 1, "strategy": "sliding_window"}])
def test_importing_an_oversized_window_ends_with_a_command_error_and_changes_nothing(site, tmp_path, fields):
    source = tmp_path / "policies.json"
    policy = {"name": "long", "action": "*", "key": "ip", **fields}
    source.write_text(json.dumps({"format": "ratelimit_app/1", "policies": [policy]}))
    before = run(site, "manage.py", "ratelimit_export").stdout
    done = run(site, "manage.py", "ratelimit_import", str(source))
    assert done.returncode == 1
    assert "CommandError" in done.stderr and "at most one year" in done.stderr
    assert "Traceback" not in done.stderr
    assert run(site, "manage.py", "ratelimit_export").stdout == before


CODE_DOORS = f"""
import json

import django

django.setup()
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import Policy
from ratelimit_app.policies import get_index

found = {{}}


def view(request):
    return None


try:
    ratelimit(rate={ENDLESS!r}, key="ip")(view)
except ImproperlyConfigured as error:
    found["decorator"] = str(error)
with override_settings(RATELIMIT_POLICIES=[{{"name": "long", "action": "/api/", "rate": {ENDLESS!r}}}]):
    found["settings"] = [m.msg for m in run_checks() if m.id == "ratelimit_app.E010"]
# a row that bypassed validation (raw SQL, old data): skipped and reported, never a hung worker
Policy.objects.bulk_create([Policy(name="raw", action="*", limit=5, window=10**17, strategy="sliding_window", key="ip")])
try:
    found["index"] = [policy.name for policy in get_index().policies]
    found["check"] = [m.msg for m in run_checks() if m.id == "ratelimit_app.W001"]
finally:
    Policy.objects.filter(name="raw").delete()
print(json.dumps(found))
"""


@pytest.mark.slow
def test_the_decorator_settings_and_raw_rows_refuse_an_oversized_window_without_hanging(site):
    done = run(site, "-c", CODE_DOORS)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert "at most one year" in found["decorator"]
    assert len(found["settings"]) == 1 and "RATELIMIT_POLICIES[0] (long)" in found["settings"][0]
    assert "at most one year" in found["settings"][0]
    assert found["index"] == []
    assert len(found["check"]) == 1 and "'raw'" in found["check"][0] and "at most one year" in found["check"][0]
