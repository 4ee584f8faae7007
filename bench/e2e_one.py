"""python bench/e2e_one.py [--seconds S] [--rounds N] NAME=TREE ...: the end-to-end run's "floor" and
"1 policy" rows only, for one or more checkouts side by side (each with its own .venv, Redis and SQLite),
interleaved in rounds so that the machine's load weighs on every tree alike; ratios are within a round's tree.

Prints, per tree: requests/s of each row, the 1-policy/floor ratio (overall and per round), site CPU us per
request and Redis commands per request (INFO stats delta / requests)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from project.devredis import free_port  # noqa: E402


def _e2e():
    """bench.e2e's load generator and CPU reader (it imports models: Django is set up first)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings_e2e")
    os.environ.setdefault("DATABASE_URL", "sqlite://:memory:")
    import django

    django.setup()
    from bench import e2e

    return e2e.wrk, e2e.processes_cpu

ROWS = (("floor", False, "/ping/"), ("1 policy", True, "/p1/"))
SETUP = """
import django; django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from bench.common import policy
from bench.e2e import POLICIES
from ratelimit_app.models import Policy
Policy.objects.all().delete()
for action, strategy in POLICIES:  # as the whole run makes them: the p1 row matches one
    policy(strategy, action=action, save=True)
"""


class Tree:
    def __init__(self, name: str, root: str, work: Path) -> None:
        self.name, self.root = name, Path(root).resolve()
        self.python = str(self.root / ".venv" / "bin" / "python")
        self.redis_port = free_port()
        self.redis = subprocess.Popen([shutil.which("redis-server"), "--port", str(self.redis_port), "--save", "",
                                       "--appendonly", "no", "--dir", str(work)], stdout=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.redis_port)
        for _ in range(100):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        self.env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                    "DATABASE_URL": f"sqlite:///{work / (name + '.sqlite3')}",
                    "DJANGO_SETTINGS_MODULE": "bench.settings_e2e", "BENCH_SERVER": "gunicorn"}
        subprocess.run([self.python, "-c", SETUP], cwd=self.root, env=self.env, check=True)
        self.sites = {}  # a site per row, its route first in the URLconf (bench/site.py's BENCH_FIRST)
        for label, middleware, path in ROWS:
            port = free_port()
            extra = os.environ.get("E2E_GUNICORN_ARGS", "").split()
            process = subprocess.Popen(
                [self.python, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}", "--log-level", "warning", *extra,
                 "project.wsgi"], cwd=self.root,
                env={**self.env, "BENCH_MIDDLEWARE": "1" if middleware else "0", "BENCH_FIRST": path})
            self.sites[label] = (port, process)

    def wait(self) -> None:
        for label, _middleware, path in ROWS:
            port = self.sites[label][0]
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.2)

    def stop(self) -> None:
        for _port, process in self.sites.values():
            process.terminate()
            process.wait(timeout=10)
        self.redis.terminate()
        self.redis.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("trees", nargs="+", help="NAME=PATH of a checkout with its .venv")
    options = parser.parse_args()
    wrk, processes_cpu = _e2e()
    work = Path(tempfile.mkdtemp(prefix="e2e-one-"))
    trees = [Tree(*spec.split("=", 1), work) for spec in options.trees]
    totals = {(t.name, row[0]): [0, 0.0, 0.0, 0] for t in trees for row in ROWS}  # requests, seconds, cpu, commands
    ratios: dict[str, list[float]] = {t.name: [] for t in trees}
    try:
        for tree in trees:
            tree.wait()
            for label, _middleware, path in ROWS:  # warm both workers
                wrk(f"http://127.0.0.1:{tree.sites[label][0]}{path}", 1)
        for number in range(options.rounds):
            order = trees if number % 2 == 0 else list(reversed(trees))
            rates = {}
            for tree in order:
                for label, _middleware, path in ROWS if number % 2 == 0 else reversed(ROWS):
                    port, process = tree.sites[label]
                    cpu, commands = processes_cpu(process.pid), tree.client.info("stats")["total_commands_processed"]
                    load = wrk(f"http://127.0.0.1:{port}{path}", options.seconds)
                    total = totals[tree.name, label]
                    total[0] += load.requests
                    total[1] += load.seconds
                    total[2] += processes_cpu(process.pid) - cpu
                    total[3] += tree.client.info("stats")["total_commands_processed"] - commands - 1
                    rates[tree.name, label] = load.requests / load.seconds
            for tree in trees:
                ratios[tree.name].append(rates[tree.name, "1 policy"] / rates[tree.name, "floor"])
    finally:
        for tree in trees:
            tree.stop()
    for tree in trees:
        print(f"== {tree.name} ({tree.root})")
        for label, _m, _p in ROWS:
            requests, seconds, cpu, commands = totals[tree.name, label]
            print(f"  {label:9s} {requests / seconds:8.0f} req/s  site CPU {cpu * 1e6 / requests:6.0f} us/req  "
                  f"Redis cmds {commands / requests:.2f}/req")
        floor, ours = (totals[tree.name, label] for label in ("floor", "1 policy"))
        overall = (ours[0] / ours[1]) / (floor[0] / floor[1])
        rounds = sorted(ratios[tree.name])
        print(f"  1 policy / floor: {overall:.3f} (median of rounds {statistics.median(rounds):.3f})  per round: "
              f"{' '.join(f'{r:.3f}' for r in ratios[tree.name])}")
        print(f"  site CPU over the floor: {(ours[2] / ours[0] - floor[2] / floor[0]) * 1e6:.0f} us/req")


if __name__ == "__main__":
    main()
