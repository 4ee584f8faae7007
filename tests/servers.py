"""Real server processes of the demo site for tests that need several workers: own database file,
the test session's Redis, free loopback ports, always stopped."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from project.devredis import free_port

ROOT = Path(__file__).resolve().parent.parent


def site_env(database: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}", "DJANGO_SETTINGS_MODULE": "project.settings"}
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def migrated_site(directory: Path, settings: str, policies: str) -> Path:
    """A site's SQLite database in `directory`, migrated, with the policies a `manage.py shell` script makes."""
    database = directory / "site.sqlite3"
    env = site_env(database, DJANGO_SETTINGS_MODULE=settings)
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", policies)
    return database


def fetch(url: str, **headers: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


class Server:
    """`manage.py runserver` (one process, threaded), gunicorn with `workers` processes, or uvicorn (ASGI)."""

    def __init__(self, env: dict[str, str], workers: int = 0, asgi: bool = False, log: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if asgi:
            command = [sys.executable, "-m", "uvicorn", "--port", str(self.port), "--log-level", "warning",
                       "project.asgi:application"]
        elif workers:
            command = [sys.executable, "-m", "gunicorn", "-w", str(workers), "-b", f"127.0.0.1:{self.port}",
                       "--log-level", "warning", "project.wsgi"]
        else:
            command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"]
        # the site logs to stderr: kept in `log` for a test that waits for what it says
        stderr = subprocess.DEVNULL if log is None else open(log, "ab")  # noqa: SIM115 - the process holds it
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        if log is not None:
            stderr.close()  # the process has its own descriptor
        # a server that died stops the wait at once; a slow start (gunicorn importing Django beside a loaded
        # suite on 2 cores took over 30 s) is waited for
        deadline = time.monotonic() + 90
        while True:
            try:
                fetch(self.url + "/")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"server on port {self.port} did not start")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


@contextlib.contextmanager
def serving(database: Path, settings: str, asgi: bool = False, workers: int = 0, log: Path | None = None,
            **extra: str) -> Iterator[Server]:
    """A server of the site in `database` under the settings module `settings` (see Server), stopped at the end."""
    server = Server(site_env(database, DJANGO_SETTINGS_MODULE=settings, **extra), workers=workers, asgi=asgi, log=log)
    try:
        yield server
    finally:
        server.stop()
