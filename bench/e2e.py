"""End to end: the same trivial view served by gunicorn (2 sync workers) and, async, by uvicorn (2
workers) on loopback under a load generator (wrk, else a Python one), with no limiter, doing one PING
(the floor of any Redis-backed limiter), with ours and with the peers; configurations interleaved in
rounds so that the machine's load weighs on all of them alike."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

from bench.common import Results, Served, policy, server
from bench.measure import server_work
from ratelimit_app.models import Policy


class Configuration(NamedTuple):
    name: str
    middleware: bool  # served with RateLimitMiddleware installed
    path: str  # in bench/site.py
    server: str = "gunicorn"  # or "uvicorn" (ASGI)


CONFIGURATIONS = (
    Configuration("no limiter", False, "/plain/"),
    Configuration("floor: the view doing one PING through django-redis", False, "/ping/"),
    Configuration("ratelimit_app middleware, no policy matching", True, "/p0/"),
    Configuration("ratelimit_app middleware, 1 policy", True, "/p1/"),
    Configuration("ratelimit_app middleware, 3 policies", True, "/p3/"),
    Configuration("limits fixed window, one hit in the view (RedisStorage)", False, "/limits/"),
    Configuration("django-ratelimit decorator", False, "/django-ratelimit/"),
    Configuration("django-smart-ratelimit decorator", False, "/smart-ratelimit/"),
    Configuration("DRF APIView, no throttle", False, "/drf/"),
    Configuration("DRF UserRateThrottle", False, "/drf-user-throttle/"),
    Configuration("ratelimit_app PolicyThrottle on the DRF view, 1 policy", False, "/drf-policy-throttle/"),
    Configuration("no limiter (async view)", False, "/async/plain/", "uvicorn"),
    Configuration("floor: the async view doing one PING through redis.asyncio", False, "/async/ping/", "uvicorn"),
    Configuration("ratelimit_app middleware (async), 1 policy", True, "/async/p1/", "uvicorn"),
    Configuration("django-smart-ratelimit aratelimit", False, "/async/smart-ratelimit/", "uvicorn"),
)
# (action, strategy): p1 and async-p1 match one policy, p3 three, the DRF view one (by throttle_scope)
POLICIES = (("p1", "fixed_window"), ("p3", "fixed_window"), ("/p3/", "sliding_window"), ("/p3", "sliding_log"),
            ("bench-drf", "fixed_window"), ("async-p1", "fixed_window"))
# the rows a budget holds against each other, measured for e2e_floor_rounds (bench/report.py)
COMPARED = frozenset({
    "no limiter", "ratelimit_app middleware, no policy matching", "floor: the view doing one PING through django-redis",
    "ratelimit_app middleware, 1 policy", "floor: the async view doing one PING through redis.asyncio",
    "ratelimit_app middleware (async), 1 policy", "limits fixed window, one hit in the view (RedisStorage)",
})
ROOT = Path(__file__).resolve().parent.parent
WRK = ["wrk", "-t2", "-c4"]
PYTHON_PROCESSES = 4
QUICK_REQUESTS = 40


def site_workers(results: Results) -> int:
    """Each site's worker processes: one in a quick run (a smoke test; each worker is a Django started)."""
    return 1 if results.quick else 2


class Load(NamedTuple):
    requests: int
    seconds: float
    failed: int


# --- servers -----------------------------------------------------------------------------------


class Site:
    """gunicorn with 2 sync workers (or uvicorn with 2 workers, ASGI) serving bench/site.py on a free loopback port,
    the route at `first` first in its URLconf."""

    def __init__(self, middleware: bool, server: str = "gunicorn", first: str = "", workers: int = 2) -> None:
        from project.devredis import free_port

        self.port = free_port()
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings_e2e", "BENCH_MIDDLEWARE": "1" if middleware else "0",
               "BENCH_SERVER": server, "BENCH_FIRST": first}
        command = {
            "gunicorn": ["gunicorn", "-w", str(workers), "-b", f"127.0.0.1:{self.port}", "--log-level", "warning",
                         "project.wsgi"],
            "uvicorn": ["bench.asgi_server", str(self.port), str(workers)],  # uvicorn --workers, TCP_NODELAY (see there)
        }[server]
        self.process = subprocess.Popen([sys.executable, "-m", *command], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        self.middleware = middleware
        self.server = server

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait(self, path: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.server} exited: {self.process.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                urllib.request.urlopen(self.url(path), timeout=2).read()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.server} did not start")

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) the server and its workers have used so far; None where /proc is not."""
        return processes_cpu(self.process.pid)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def processes_cpu(root: int) -> float | None:
    """CPU seconds (user + system) of process `root` and its descendants, from /proc (Linux)."""
    proc = Path("/proc")
    if not (proc / str(root) / "stat").exists():
        return None
    parents, used = {}, {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            parents[int(entry.name)] = int(fields[1])  # ppid, then utime and stime at 11 and 12
            used[int(entry.name)] = int(fields[11]) + int(fields[12])
    family, grown = {root}, True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in family} - family
        family |= more
        grown = bool(more)
    return sum(used.get(pid, 0) for pid in family) / os.sysconf("SC_CLK_TCK")


def _work(site: Site, redis_client) -> tuple:
    """What the server has done so far: Redis commands and their microseconds, the site's CPU seconds
    (None where /proc is not) and Redis's CPU seconds."""
    commands, script_usec, other_usec, redis_cpu = server_work(redis_client)
    return commands, script_usec, other_usec, site.cpu_seconds(), redis_cpu


# --- load generators ---------------------------------------------------------------------------


def wrk(url: str, seconds: int) -> Load:
    done = subprocess.run([*WRK, f"-d{seconds}s", url], capture_output=True, text=True, timeout=seconds + 30)
    total = re.search(r"(\d+) requests in ([\d.]+)(m?s)", done.stdout)
    if not total:
        raise RuntimeError(f"wrk printed no count:\n{done.stdout}\n{done.stderr}")
    taken = float(total.group(2)) / (1000 if total.group(3) == "ms" else 1)
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    return Load(int(total.group(1)), taken, int(failed.group(1)) if failed else 0)


def python_load(port: int, path: str, seconds: float, limit: int = 200_000, processes: int = PYTHON_PROCESSES) -> Load:
    """`processes` processes of bench/load.py, bounded in time and count. Separate interpreters, not
    forks: a fork of this process (threads, locks held) could hang in the child."""
    command = [sys.executable, "-m", "bench.load", str(port), path, str(seconds), str(max(1, limit // processes))]
    started = time.perf_counter()
    workers = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    counts = []
    try:
        for worker in workers:
            counts.append([int(n) for n in worker.communicate(timeout=seconds + 60)[0].split()])
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    return Load(sum(c[0] for c in counts), time.perf_counter() - started, sum(c[1] for c in counts))


def _rounds(results: Results) -> str:
    rounds = f"{results.e2e_rounds} x {results.e2e_seconds:g} s per configuration"
    if results.e2e_floor_rounds > results.e2e_rounds:
        rounds += f" ({results.e2e_floor_rounds} x for the rows the budgets hold against each other)"
    return rounds


def generator(results: Results):
    """wrk when it is there (make bench installs it with scripts/ensure-wrk), else the Python one. A quick run
    (a smoke test) sends QUICK_REQUESTS per configuration and round from one process of the Python one, wrk
    or not: its figures are no comparison, and it takes the same few seconds on every machine."""
    if results.quick:
        results.e2e_generator = f"a Python load generator, {QUICK_REQUESTS} requests per configuration (a quick run)"
        return lambda site, path, seconds: python_load(site.port, path, seconds, QUICK_REQUESTS, processes=1)
    if not shutil.which("wrk"):
        subprocess.run([str(ROOT / "scripts" / "ensure-wrk")], check=False)
    if shutil.which("wrk"):
        results.e2e_generator = f"`{' '.join(WRK)}`, {_rounds(results)}"
        return lambda site, path, seconds: wrk(site.url(path), seconds)
    results.e2e_generator = (f"a Python load generator ({PYTHON_PROCESSES} processes, one request per connection; wrk "
                             f"is not installed), {_rounds(results)}")
    return lambda site, path, seconds: python_load(site.port, path, seconds)


# --- the run -----------------------------------------------------------------------------------


def _site_key(configuration: Configuration, quick: bool) -> tuple[str, bool, str]:
    """The site that serves a row: its own, its route first in the URLconf, so that resolving costs every row
    the same; a quick run (a smoke test, its figures no comparison) shares one per server and middleware."""
    return configuration.server, configuration.middleware, "" if quick else configuration.path


def end_to_end(results: Results) -> None:
    from bench.site import urlpatterns

    served = {f"/{pattern.pattern}" for pattern in urlpatterns}
    configurations = [c for c in CONFIGURATIONS if c.path in served]
    results.notes += [f"end to end: {c.name} is left out ({c.path} is not served; a peer is not installed)"
                      for c in CONFIGURATIONS if c.path not in served]
    Policy.objects.all().delete()
    for action, strategy in POLICIES:
        policy(strategy, action=action, save=True)
    load = generator(results)
    sites: dict[tuple[str, bool, str], Site] = {}
    # requests, seconds, failed, commands, script usec, other usec, worker CPU s, Redis CPU s
    totals = {c.name: [0, 0.0, 0, 0, 0, 0, 0.0, 0.0] for c in configurations}
    rounds: dict[str, list[float]] = {c.name: [] for c in configurations}  # requests/s of each round
    seconds = int(results.e2e_seconds)
    redis_client = server()
    try:
        for configuration in configurations:  # one at a time: a dozen starting at once outlast the wait on 2 cores
            key = _site_key(configuration, results.quick)
            if key not in sites:
                sites[key] = Site(configuration.middleware, configuration.server, key[2], site_workers(results))
                sites[key].wait(configuration.path)
        for configuration in configurations:  # both workers of each site import and load everything
            site = sites[_site_key(configuration, results.quick)]
            if results.quick:
                urllib.request.urlopen(site.url(configuration.path), timeout=5).read()
            else:
                load(site, configuration.path, 1)
        for number in range(max(results.e2e_rounds, results.e2e_floor_rounds)):
            chosen = [c for c in configurations if number < results.e2e_rounds or c.name in COMPARED]
            for configuration in chosen if number % 2 == 0 else reversed(chosen):
                site = sites[_site_key(configuration, results.quick)]
                before = _work(site, redis_client)
                done = load(site, configuration.path, seconds)
                spent = [None if b is None else a - b for a, b in zip(_work(site, redis_client), before)]
                total = totals[configuration.name]
                rounds[configuration.name].append(done.requests / done.seconds)
                for i, value in enumerate((*done, *spent)):
                    total[i] = None if value is None or total[i] is None else total[i] + value
    finally:
        for site in sites.values():
            site.stop()
        Policy.objects.all().delete()
    for configuration in configurations:
        requests, taken, failed, commands, script_usec, other_usec, worker_cpu, redis_seconds = totals[configuration.name]
        per_request = 1e6 / max(requests, 1)
        results.e2e.append(Served(configuration.name, requests / taken, requests, failed, commands / max(requests, 1),
                                  script_usec / max(requests, 1), other_usec / max(requests, 1), configuration.server,
                                  None if worker_cpu is None else worker_cpu * per_request, redis_seconds * per_request,
                                  tuple(rounds[configuration.name])))
        if commands < 0.5 * requests and not configuration.name.startswith("no ") and "no " not in configuration.name:
            # a limiter that never asked Redis decided nothing (a backend failing open): its figure is no comparison
            results.notes.append(f"end to end: {configuration.name} ran {commands / max(requests, 1):.2f} Redis "
                                 "commands per request: it did not decide, its row measures no limiter")
