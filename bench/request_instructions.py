"""python -m bench.request_instructions [--rows N,...] [--only ROUTE,...] [--counts A,B]: the instructions the worker process runs per
request (valgrind's callgrind), through Django's handler, by configuration: counts a busy machine does
not change, so that a change of a few thousand instructions shows.

Each row runs in a process of its own under callgrind (instrumentation off while Django starts): a
direct WSGIHandler call (ASGIHandler for the async rows) with the environ gunicorn builds for wrk's
request, the body closed as a server does, bench/settings_e2e.py with the row's route first in the
URLconf. Requests are counted N=300 and N=900 times: a request's cost is their difference over 600
(what a run costs once cancels out), and each N's own figure is shown beside it. The tally's flush
and the metrics' fold (their timers kept off meanwhile) are measured apart, per request.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
COUNTS = (300, 900)
COMMAND = "python -m bench.request_instructions"


class Configuration(NamedTuple):
    name: str
    route: str  # URL name in bench/site.py (put first in the URLconf)
    path: str
    middleware: bool  # RateLimitMiddleware installed
    server: str = "wsgi"  # or "asgi"


ROWS = (
    Configuration("plain view", "plain", "/plain/", False),
    Configuration("floor: view + one PING", "ping-kept", "/ping-kept/", False),
    Configuration("middleware, no policy matching", "p0", "/p0/", True),
    Configuration("middleware, 1 fixed-window policy", "p1", "/p1/", True),
    Configuration("middleware, 1 token bucket policy", "p1-token-bucket", "/p1-token-bucket/", True),
    Configuration("middleware, 3 policies", "p3", "/p3/", True),
    Configuration("@ratelimit, 1 fixed-window policy", "decorated", "/decorated/", False),
    Configuration("limits FixedWindowRateLimiter.hit in the view", "limits", "/limits/", False),
    Configuration("DRF view, no throttle", "drf", "/drf/", False),
    Configuration("DRF view + one PING", "drf-ping-kept", "/drf-ping-kept/", False),
    Configuration("DRF view + PolicyThrottle, 1 policy", "drf-policy-throttle", "/drf-policy-throttle/", False),
    Configuration("async: plain view", "async-plain", "/async/plain/", False, "asgi"),
    Configuration("async: floor: view + one PING", "async-ping", "/async/ping/", False, "asgi"),
    Configuration("async: middleware, 1 fixed-window policy", "async-p1", "/async/p1/", True, "asgi"),
)
# (action, strategy): the policies the rows meet (bench/site.py's names)
POLICIES = (("p1", "fixed_window"), ("p3", "fixed_window"), ("/p3/", "sliding_window"), ("/p3", "sliding_log"),
            ("p1-token-bucket", "token_bucket"), ("bench-drf", "fixed_window"), ("bench-decorated", "fixed_window"),
            ("async-p1", "fixed_window"))
# what each row is compared with: (the row, the figure: what it costs over that row)
OVER = {
    "middleware, no policy matching": "plain view",
    "middleware, 1 fixed-window policy": "floor: view + one PING",
    "middleware, 1 token bucket policy": "floor: view + one PING",
    "middleware, 3 policies": "floor: view + one PING",
    "@ratelimit, 1 fixed-window policy": "floor: view + one PING",
    "limits FixedWindowRateLimiter.hit in the view": "floor: view + one PING",
    "DRF view + one PING": "DRF view, no throttle",  # a round trip's own cost, in every row's figure
    "DRF view + PolicyThrottle, 1 policy": "DRF view, no throttle",
    "async: middleware, 1 fixed-window policy": "async: floor: view + one PING",
}


# --- the worker (runs under callgrind) ------------------------------------------------------------


def _environ(path: str) -> dict:
    """What gunicorn 23's sync worker makes of wrk's `GET <path> HTTP/1.1` with its Host header."""
    return {
        "wsgi.errors": sys.stderr, "wsgi.version": (1, 0), "wsgi.multithread": False, "wsgi.multiprocess": True,
        "wsgi.run_once": False, "wsgi.input_terminated": True, "SERVER_SOFTWARE": "gunicorn/23.0.0",
        "wsgi.input": io.BytesIO(b""), "REQUEST_METHOD": "GET", "QUERY_STRING": "", "RAW_URI": path,
        "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": "127.0.0.1:8080", "wsgi.url_scheme": "http",
        "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "50000", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8080",
        "PATH_INFO": path, "SCRIPT_NAME": "",
    }


def _wsgi_requests(path: str):
    from django.core.handlers.wsgi import WSGIHandler

    handler = WSGIHandler()

    def start_response(status, headers, exc_info=None):
        if not status.startswith("200"):
            raise RuntimeError(f"{path} answered {status}")

    def one():
        environ = _environ(path)
        environ["wsgi.input"] = io.BytesIO(b"")
        response = handler(environ, start_response)
        for _chunk in response:
            pass
        response.close()  # as the server does once the body is sent: request_finished

    return lambda count: [one() for _ in range(count)]


def _asgi_requests(path: str):
    from django.core.handlers.asgi import ASGIHandler

    handler = ASGIHandler()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8080")], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080)}

    async def one():
        given = False

        async def receive():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Future()  # the client stays: the handler cancels this when the response is sent

        async def send(message):
            if message["type"] == "http.response.start" and message["status"] != 200:
                raise RuntimeError(f"{path} answered {message['status']}")

        await handler(dict(scope), receive, send)

    async def many(count):
        for _ in range(count):
            await one()

    return lambda count: loop.run_until_complete(many(count))


class _Held:
    """Stands in for a timer already armed: the tally's flush and the metrics' fold run only when asked."""

    def cancel(self) -> None:
        pass


def worker(route: str, path: str, server: str) -> None:
    import django

    django.setup()
    from django.conf import settings

    from ratelimit_app import conf, metrics, policies

    # the policies' recheck and reload are due by the clock, which runs 50x slower under callgrind: a count per
    # request would then depend on the machine's speed (at a real server's rate, they weigh nothing). The
    # longest the settings take: a longer one is refused for the default (1 s and 30 s)
    settings.RATELIMIT_POLICY_RECHECK_SECONDS = settings.RATELIMIT_POLICY_RELOAD_SECONDS = 86400
    conf.forget_settings()
    policies.forget_settings()
    from ratelimit_app.engine.tally import tally

    requests = (_asgi_requests if server == "asgi" else _wsgi_requests)(path)
    held = _Held()

    def hold_timers():
        tally._flusher = held
        metrics._folder = held

    def flush():
        tally._flush()
        metrics.fold()
        hold_timers()

    hold_timers()
    requests(50)  # warm: connections, scripts loaded, caches filled
    flush()  # its heartbeat (a TIME read and a word to Redis) is the last: due every 10 s by the clock, it fell
    tally._heartbeat_due = float("inf")  # in one of the counted flushes or in both, 0.5-1k a request apart
    # the database connection the policies were loaded on (CONN_MAX_AGE keeps it): Django checks a kept one
    # at every request's start and end, and closes it once it is older than that by the clock, in the middle
    # of a run under callgrind; rows whose path never opens one would carry that difference
    from django.db import connections

    connections.close_all()
    print("ready", flush=True)
    for line in sys.stdin:
        word, _, count = line.strip().partition(" ")
        if word == "run":
            requests(int(count))
        elif word == "flush":
            flush()
        elif word == "tally":  # the tally's flush alone (a look into the flush's share)
            tally._flush()
            hold_timers()
        print("done", flush=True)


# --- the measuring side ------------------------------------------------------------------------


class Grind:
    """One row's worker under callgrind; total() is the instructions run since the last zero()."""

    def __init__(self, row: Configuration, env: dict) -> None:
        self.dir = tempfile.mkdtemp(prefix="rl-request-callgrind-")
        self.process = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={self.dir}/cg.out",
             sys.executable, "-m", "bench.request_instructions", "--worker", row.route, row.path, row.server],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._wait()
        self._control("-i", "on")

    def _wait(self) -> None:
        line = self.process.stdout.readline()
        if line.strip() not in ("ready", "done"):
            self.process.kill()
            raise RuntimeError(f"the worker failed: {line}{self.process.stderr.read()[-3000:]}")

    def _control(self, *options: str) -> None:
        subprocess.run(["callgrind_control", *options, str(self.process.pid)], check=True, capture_output=True)

    def ask(self, command: str, keep: str | None = None) -> int:
        """The instructions the worker runs doing `command`; its callgrind dump copied to `keep` if given."""
        self._control("-z")
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        self._wait()
        for dump in glob.glob(f"{self.dir}/cg.out.*"):
            os.unlink(dump)
        self._control("-d")
        for dump in glob.glob(f"{self.dir}/cg.out.*"):
            if keep:
                shutil.copyfile(dump, keep)
            with open(dump, encoding="utf-8", errors="replace") as text:
                for line in text:
                    if line.startswith(("summary:", "totals:")):
                        return int(line.split()[1])
        raise RuntimeError("callgrind wrote no totals")

    def stop(self) -> None:
        # SIGTERM, not the end of stdin: every count was dumped already, and Python's exit run instrumented
        # (its final dump too) took ~4 s of CPU a row for nothing
        self.process.terminate()
        self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Measured(NamedTuple):
    per_request: float  # (instructions of N=900 - of N=300) / 600
    each_n: tuple[float, ...]  # instructions / N, per N
    flush: float  # the tally's flush and the metrics' fold, per request
    commands: float  # Redis commands per request (server side, the flush's included)


def measure(row: Configuration, env: dict, counts: tuple[int, ...] = COUNTS, keep: str | None = None) -> Measured:
    """`keep`: a directory where the callgrind dump of each count's run is kept (<route>.<N>.out), for
    callgrind_annotate --inclusive=yes."""
    from bench.common import server
    from bench.measure import server_commands

    grind = Grind(row, env)
    try:
        totals, flushes = [], []
        before = server_commands(server())
        for count in counts:
            totals.append(grind.ask(f"run {count}", keep and os.path.join(keep, f"{row.route}.{count}.out")))
            flushes.append(grind.ask("flush"))
        commands = (server_commands(server()) - before) / sum(counts)  # (server_commands leaves out its INFO)
    finally:
        grind.stop()
    low, high = counts[0], counts[-1]
    return Measured((totals[-1] - totals[0]) / (high - low), tuple(t / n for t, n in zip(totals, counts)),
                    (flushes[-1] - flushes[0]) / (high - low), commands)


def _available(row: Configuration) -> str | None:
    """Why the row cannot be measured here, or None."""
    if row.route == "limits":
        try:
            import limits  # noqa: F401
        except ImportError:
            return "limits is not installed (bench/requirements.txt)"
    return None


SECTION = "## Instructions per request (callgrind)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", help="comma-separated row numbers (1-based) to measure; default: all")
    parser.add_argument("--only", help="comma-separated routes (p1, decorated...: the second column of ROWS) to measure")
    parser.add_argument("--counts", default=",".join(map(str, COUNTS)), help="the two request counts (default: %(default)s)")
    parser.add_argument("--keep", metavar="DIR", help="keep each row's callgrind dumps in DIR (<route>.<N>.out)")
    parser.add_argument("--write", metavar="FILE", help="also write the table into FILE's section '%s'" % SECTION)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(*options.worker)
        return
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("valgrind is not installed: the instructions per request are not measured (apt-get install valgrind)")
        return
    from bench.__main__ import WORK, configure

    work = WORK / "request-instructions"
    configure(work)  # its own database: policies of its own
    from bench.common import policy
    from ratelimit_app.models import Policy

    Policy.objects.all().delete()
    for action, strategy in POLICIES:
        policy(strategy, action=action, save=True)
    counts = tuple(int(n) for n in options.counts.split(","))
    chosen = ROWS if not options.rows else [ROWS[int(n) - 1] for n in options.rows.split(",")]
    if options.only:
        routes = options.only.split(",")
        unknown = set(routes) - {row.route for row in ROWS}
        if unknown:
            parser.error(f"--only: no row has the route {', '.join(sorted(unknown))}")
        chosen = [row for row in chosen if row.route in routes]
    table: list[str] = []

    def say(line: str, flush: bool = False) -> None:
        print(line, flush=True)
        table.append(line)

    say(f"Instructions per request in the worker process (callgrind; N={counts[0]} and N={counts[-1]}): {COMMAND}")
    say(f"| {'configuration':45} | {'instr/request':>13} | {'over':>9} | {'flush+fold':>10} | "
          f"{'each N':>19} | {'redis cmds':>10} |")
    say(f"|{'-' * 47}|{'-' * 15}:|{'-' * 10}:|{'-' * 11}:|{'-' * 20}:|{'-' * 11}:|")
    measured: dict[str, Measured] = {}
    for row in chosen:
        why = _available(row)
        if why:
            say(f"| {row.name:45} | {'n/a':>13} | {'':>9} | {'':>10} | {why} |", flush=True)
            continue
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings_e2e", "BENCH_FIRST": row.route, "PYTHONHASHSEED": "0",
               "BENCH_MIDDLEWARE": "1" if row.middleware else "0",
               "BENCH_SERVER": "uvicorn" if row.server == "asgi" else "gunicorn"}
        if options.keep:
            os.makedirs(options.keep, exist_ok=True)
        got = measured[row.name] = measure(row, env, counts, options.keep)
        base = measured.get(OVER.get(row.name, ""))
        # what the row costs over its comparison, its flush included (the comparisons flush nothing)
        over = f"{got.per_request + got.flush - base.per_request - base.flush:9,.0f}" if base else ""
        each = ", ".join(f"{n / 1000:,.1f}k" for n in got.each_n)
        say(f"| {row.name:45} | {got.per_request:13,.0f} | {over:>9} | {got.flush:10,.0f} | {each:>19} | "
              f"{got.commands:10.2f} |", flush=True)
    say("over: instructions over the row compared (middleware no match: the plain view; DRF PolicyThrottle and "
          "DRF + PING: the DRF view; the rest: the view doing one PING), the flush and fold included. DRF "
          "PolicyThrottle's figure holds its Redis round trip, which the others' floor holds: DRF + PING's over "
          "is that round trip's share.")
    if options.write:
        _write_section(options.write, table)


def _write_section(path: str, table: list[str]) -> None:
    """The table as FILE's section SECTION, in place of the one a run before wrote (make bench: RESULTS.md)."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    section = f"{SECTION}\n\n" + "\n".join(table) + "\n"
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


if __name__ == "__main__":
    main()
