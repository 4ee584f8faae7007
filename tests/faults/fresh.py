"""Fresh databases and freshly started processes for the fault suite: each scenario gets an empty
database of the kind the suite runs on (a SQLite file, or a new PostgreSQL database on the same
server), dropped afterwards, and processes that share it and the session's Redis."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator, NamedTuple
from urllib.parse import quote

from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent.parent
SETTINGS = "tests.faults.code_settings"
HANG = 120  # seconds any one command may take before the scenario fails instead of hanging


def on_postgresql() -> bool:
    return settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


@contextlib.contextmanager
def fresh_database(tmp_path: Path) -> Iterator[str]:
    """The DATABASE_URL of an empty database (no table), of the suite's kind; removed afterwards."""
    if not on_postgresql():
        yield f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
        return
    import psycopg

    server = settings.DATABASES["default"]
    name = f"ratelimit_fresh_{uuid.uuid4().hex[:12]}"
    credentials = quote(server.get("USER") or "postgres") + (f":{quote(server['PASSWORD'])}" if server.get("PASSWORD") else "")
    address = f"{server.get('HOST') or '127.0.0.1'}:{server.get('PORT') or 5432}"
    admin = dict(dbname="postgres", user=server.get("USER") or "postgres", password=server.get("PASSWORD") or None,
                 host=server.get("HOST") or "127.0.0.1", port=server.get("PORT") or 5432, autocommit=True)
    with psycopg.connect(**admin) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{credentials}@{address}/{name}"
    finally:
        with psycopg.connect(**admin) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def site_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": SETTINGS}
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`manage.py ARGS` in a process of its own; the caller looks at its exit code and output."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG)


class Worker(NamedTuple):
    statuses: list[int]
    log: str  # what the process wrote to stderr (the app's warnings and errors)


def fresh_workers(env: dict[str, str], path: str, requests: int, processes: int = 8) -> list[Worker]:
    """Start `processes` fresh processes of the site, let them all reach the point of their first
    request, then release them together; each makes `requests` GETs to `path`."""
    command = [sys.executable, "-m", "tests.faults.code_worker", path, str(requests)]
    workers = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    try:
        for worker in workers:
            line = worker.stdout.readline().strip()
            assert line == "ready", f"a worker did not start: {line!r} {worker.stderr.read() if worker.poll() is not None else ''}"
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results = []
        for worker in workers:
            out, err = worker.communicate(timeout=HANG)
            assert worker.returncode == 0, err[-3000:]
            results.append(Worker(json.loads(out.strip().splitlines()[-1]), err))
        return results
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
