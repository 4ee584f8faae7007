"""The measure of "drop-in": DRF 3.18's tests/test_throttling.py and django-ratelimit 4.1.0's
django_ratelimit/tests.py, fetched from their source distributions and run unchanged against
ratelimit_app.compat (imports swapped by tests/upstream/plugin.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.upstream.fetch import ROOT, fetch
from tests.upstream.plugin import EXPECTED_FAILURES

pytestmark = pytest.mark.slow


def test_the_upstream_test_files_pass_against_the_compat_modules(tmp_path):
    files = fetch()
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "tests" / "upstream" / "upstream.ini"), "--rootdir", str(ROOT), "--ds=tests.upstream.settings",
         "-q", "-rfE", f"--junitxml={report}", *map(str, files)],
        cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=300,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # every upstream test ran: DRF's 29 and django-ratelimit's 52, the listed exceptions failing as expected
    assert summary.startswith(f"{81 - len(EXPECTED_FAILURES)} passed, {len(EXPECTED_FAILURES)} xfailed"), summary


def _environment() -> dict[str, str]:
    """This session's environment for the nested run, on its own SQLite test database: a PostgreSQL
    one (CI's DATABASE_URL) is in use by this very session."""
    return {**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, "PYTHONPATH": str(ROOT)}
