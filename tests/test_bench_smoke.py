"""`python -m bench --quick` runs from start to end and prints its report, so the bench cannot rot
unnoticed while the engine changes. No timing is asserted: only that every part ran and printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from project.devredis import PrivateRedis
from ratelimit_app.models import Policy

# the quick run takes about a minute alone and several times that beside the suite on 2 cores; its
# subprocess has a timeout of its own (600 s), which this one must outlast to report it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(700)]
ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("## Decisions", "## Spread workload", "## Memory per subject", "## Scripts' memory", "## Python overhead",
            "## Local deny cache", "## Metered usage", "## Live page", "## End to end", "## Cluster", "## Budgets")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    work = tmp_path_factory.mktemp("bench")
    output = work / "RESULTS.md"
    # a server of its own: the bench empties the one it measures
    with PrivateRedis() as server:
        done = subprocess.run(
            [sys.executable, "-m", "bench", "--quick", "--output", str(output), "--workdir", str(work)],
            cwd=ROOT, env={**os.environ, "REDIS_URL": server.url}, capture_output=True, text=True, timeout=600,
        )
    return done, output


def test_quick_bench_runs_and_prints_every_section(quick_run):
    done, output = quick_run
    assert done.returncode == 0, done.stderr[-4000:]
    for section in SECTIONS:
        assert section in done.stdout, section
    assert output.read_text(encoding="utf-8") in done.stdout


@pytest.mark.parametrize("strategy", [value for value, _label in Policy._meta.get_field("strategy").choices])
def test_quick_bench_measures_every_strategy_a_policy_may_have(quick_run, strategy):
    done, _ = quick_run
    row = re.search(rf"^\| ratelimit_app {strategy}, 1 policy \| ([\d,.]+) \|", done.stdout, re.MULTILINE)
    assert row, f"no measured row for {strategy}"


def test_every_budget_is_marked_pass_miss_or_na(quick_run):
    done, _ = quick_run
    budgets = done.stdout.split("## Budgets", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in budgets.splitlines() if line.startswith("| ") and not line.startswith("| budget")]
    assert len(rows) >= 15
    for line in rows:
        assert line.rstrip().endswith(("| PASS |", "| **MISS** |", "| n/a |")), line


def test_a_prune_beside_an_earlier_versions_library_leaves_one_of_ours(quick_run):
    done, _ = quick_run
    assert re.search(r"^Libraries of ours after the prune: 1 \(of 2; deleted ratelimit_0000bench_stale", done.stdout,
                     re.MULTILINE), done.stdout.split("## Scripts' memory", 1)[-1][:1500]


def test_the_floor_budgets_show_how_far_the_ratio_moved_from_round_to_round():
    from bench.common import Results, Served
    from bench.report import ASGI_FLOOR, WSGI_FLOOR, _end_to_end_budgets

    results = Results(quick=False, samples=1)
    results.e2e = [
        Served("no limiter", 200.0, 600, 0, 0, 0, 0, rounds=(200.0, 200.0, 200.0)),
        Served("ratelimit_app middleware, no policy matching", 198.0, 594, 0, 0, 0, 0, rounds=(196.0, 198.0, 200.0)),
        Served(WSGI_FLOOR, 100.0, 300, 0, 1, 0, 0, rounds=(100.0, 100.0, 100.0)),
        Served("ratelimit_app middleware, 1 policy", 96.0, 288, 0, 2, 0, 0, rounds=(90.0, 99.0, 95.0)),
        Served(ASGI_FLOOR, 50.0, 150, 0, 1, 0, 0, "uvicorn", rounds=(50.0, 50.0)),
        Served("ratelimit_app middleware (async), 1 policy", 45.0, 135, 0, 2, 0, 0, "uvicorn", rounds=(40.0, 50.0)),
    ]
    rows = {budget: (measured, verdict) for budget, measured, verdict in _end_to_end_budgets(results)}
    wsgi = rows["end to end: 1 policy >= 0.95x the one-PING floor"]
    assert wsgi == ("0.960x (96 against 100 req/s; by round 0.900 to 0.990, median 0.950)", "PASS")
    asgi = rows["end to end, ASGI: 1 policy >= 0.95x the async one-PING floor"]
    assert asgi[0].endswith("; by round 0.800 to 1.000, median 0.900)") and asgi[1] == "**MISS**"
    idle = rows["end to end: no policy matching >= 0.98x no middleware"]
    assert idle == ("0.990x (by round 0.980 to 1.000, median 0.990)", "PASS")


def test_every_row_a_floor_budget_compares_gets_the_extra_rounds():
    from bench.e2e import COMPARED, CONFIGURATIONS
    from bench.report import ASGI_FLOOR, LIMITS_E2E, WSGI_FLOOR

    compared = {WSGI_FLOOR, ASGI_FLOOR, LIMITS_E2E, "no limiter", "ratelimit_app middleware, no policy matching",
                "ratelimit_app middleware, 1 policy", "ratelimit_app middleware (async), 1 policy"}
    assert compared == COMPARED
    assert COMPARED <= {configuration.name for configuration in CONFIGURATIONS}


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is not installed")
def test_the_instructions_table_counts_a_request_and_its_redis_call():
    # the plain view and one policy through the middleware, few requests: the table is printed with its command.
    # 20 and 60: a run's one-off work (a full collection, ~1.6M instructions, seen at 5 and 15 on Python 3.13)
    # spread over 40 requests cannot hide the ~150k a decision costs over the plain view
    with PrivateRedis() as server:
        done = subprocess.run(
            [sys.executable, "-m", "bench.request_instructions", "--rows", "1,4", "--counts", "20,60"],
            cwd=ROOT, env={**os.environ, "REDIS_URL": server.url}, capture_output=True, text=True, timeout=900,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "python -m bench.request_instructions" in done.stdout
    rows = {match[0].strip(): match[1:] for match in
            re.findall(r"^\| ([^|]+) \| +([\d,]+) \|[^|]*\|[^|]*\|[^|]*\| +([\d.]+) \|$", done.stdout, re.MULTILINE)}
    assert float(rows["plain view"][1]) == 0  # no Redis command
    assert float(rows["middleware, 1 fixed-window policy"][1]) >= 1  # the decision's one call, at least
    assert int(rows["middleware, 1 fixed-window policy"][0].replace(",", "")) > int(rows["plain view"][0].replace(",", ""))
