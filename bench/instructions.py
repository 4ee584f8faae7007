"""python -m bench.instructions: the instructions a private redis-server runs per decision (valgrind's
callgrind), ours against `limits`, on the spread workload; counts that a busy machine does not change.

Each row: SUBJECTS subjects decided ROUNDS times each, one client, fresh limits, the worker's tally written every
BATCH decisions; instructions per decision of the whole server (commands, sockets, event loop), and above PING's.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis

SUBJECTS = 1_000
ROUNDS = 5
BATCH = 1_000  # decisions a tally flush writes (a worker's timer flushes every quarter of a second)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Callgrind:
    """redis-server under callgrind; total() is the instructions run since the last zero()."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rl-callgrind-")
        self.port = _free_port()
        server = shutil.which("redis-server") or sys.exit("redis-server is not on PATH")
        self.process = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/cg.out", server,
             "--port", str(self.port), "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        client = redis.Redis.from_url(self.url)
        for _ in range(600):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError("redis-server under callgrind did not start")

    def _control(self, option: str) -> None:
        subprocess.run(["callgrind_control", option, str(self.process.pid)], check=True, capture_output=True)

    def zero(self) -> None:
        self._control("-z")

    def total(self) -> int:
        for dump in glob.glob(f"{self.dir}/cg.out.*"):
            os.unlink(dump)
        self._control("-d")
        (dump,) = glob.glob(f"{self.dir}/cg.out.*")
        with open(dump, encoding="utf-8", errors="replace") as text:
            for line in text:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def rows():
    """(name, make): make() returns the operation on subject i (connected and loaded beforehand)."""
    from bench import suites
    from bench.common import HUGE, unique

    def ping():
        client = suites.client()
        return lambda who: client.ping()

    counting = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "calendar_quota")
    return [
        ("floor: PING", ping),
        ("limits fixed window (EVALSHA)", lambda: suites._limits("fixed", f"{HUGE}/hour", f"bench-{unique()}", True)),
        ("ours fixed_window (FCALL)", suites._spreading(("fixed_window",))),
        ("ours token_bucket, burst in use", suites._spreading(("token_bucket",), **suites.BURST_TERMS)),
        ("ours sliding_window", suites._spreading(("sliding_window",))),
        ("ours sliding_log", suites._spreading(("sliding_log",))),
        ("ours calendar_quota", suites._spreading(("calendar_quota",))),
        ("ours mixed, 10 policies", suites._spreading(tuple(counting[i % 5] for i in range(10)))),
    ]


def main() -> None:
    grind = Callgrind()
    os.environ["REDIS_URL"] = grind.url
    try:
        from bench.__main__ import WORK, configure

        configure(WORK / "instructions")  # its own database: a bench may run beside it
        from django.conf import settings

        options = settings.CACHES["default"]["OPTIONS"]  # a server under callgrind answers 50x slower
        options["SOCKET_TIMEOUT"] = options["SOCKET_CONNECT_TIMEOUT"] = 30
        from bench.common import server
        from bench.measure import command_stats
        from ratelimit_app.engine.tally import tally

        print(f"redis {server().info('server')['redis_version']} under callgrind; {SUBJECTS} subjects x {ROUNDS}")
        print(f"{'what':34} {'instr/decision':>15} {'above PING':>11} {'server cmds/decision':>21}")
        floor = None
        for name, make in rows():
            operation = make()
            operation(0)  # connected, the script loaded
            tally.flush()
            with tally._flushing:  # the tally written every BATCH decisions, not by a timer (a load-free count)
                server().config_resetstat()
                grind.zero()
                for number in range(ROUNDS * SUBJECTS):
                    operation(number % SUBJECTS)
                    if number % BATCH == BATCH - 1:
                        tally._flush()  # what the decisions owe the policies' records is part of their cost
                instructions = grind.total() / (ROUNDS * SUBJECTS)
                stats = command_stats(server())
            commands = (sum(calls for calls, _ in stats.values()) - 2) / (ROUNDS * SUBJECTS)  # less CONFIG, INFO
            floor = instructions if floor is None else floor
            print(f"{name:34} {instructions:15,.0f} {instructions - floor:11,.0f} {commands:21.2f}", flush=True)
    finally:
        grind.stop()


if __name__ == "__main__":
    sys.exit(main())
