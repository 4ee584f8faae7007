"""The measurements of `make bench`, each a function returning rows of figures."""

from __future__ import annotations

import secrets
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.contrib.auth.models import AnonymousUser
from django.core.cache import caches
from django.http import HttpResponse
from django.test import RequestFactory
from django_redis import get_redis_connection

from bench.measure import admitted, cpu_per_call, latencies, outside_redis, p50, p99, per_call, throughput
from ratelimit_app import engine, keys, scripts
from ratelimit_app.engine import Check
from ratelimit_app.models import Policy
from ratelimit_app.policies import compile_policy
from ratelimit_app.subjects import parse_key_spec, subject_for

STRATEGIES = ("fixed_window", "sliding_window", "sliding_log")
HUGE = 10**9
ROOT = Path(__file__).resolve().parent.parent
def _unique() -> int:
    # forked workers create policies too: ids must not repeat across processes
    return secrets.randbelow(10**9) + 10**6
factory = RequestFactory()


@dataclass
class Results:
    samples: int
    seconds: float = 2.0  # per throughput measurement
    e2e_seconds: int = 5  # per load-generator run
    floors: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)  # (name, p50, p99, trips, bytes, commands, per second, admitted)
    memory: list = field(default_factory=list)  # (strategy, limit, bytes, entries)
    overhead: dict = field(default_factory=dict)
    e2e: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    versions: dict = field(default_factory=dict)


def policy(strategy: str, limit: int = HUGE, window: int = 3600, key: str = "ip", action: str = "*", save=False):
    row = Policy(name=f"bench-{_unique()}", action=action, limit=limit, window=window, strategy=strategy, key=key)
    row.full_clean()
    if save:
        row.save()
    else:
        row.pk = _unique()
    return compile_policy(row)


def request(ip: str = "203.0.113.7", path: str = "/demo/search/"):
    made = factory.get(path, REMOTE_ADDR=ip)
    made.user = AnonymousUser()
    return made


def subject(ip: str = "203.0.113.7"):
    return subject_for(parse_key_spec("ip"), request(ip))


def client():
    return get_redis_connection("default")


# --- floors ------------------------------------------------------------------------------------


def floors(results: Results) -> None:
    redis_client = client()
    trivial = redis_client.register_script("return 1")
    ping = latencies(redis_client.ping, results.samples)
    evalsha = latencies(lambda: trivial([], []), results.samples)
    results.floors = {"ping_p50": p50(ping), "ping_p99": p99(ping), "evalsha_p50": p50(evalsha), "evalsha_p99": p99(evalsha)}
    results.rows.append(("floor: PING", p50(ping), p99(ping), 1, None, 1, None, None))
    results.rows.append(("floor: EVALSHA `return 1`", p50(evalsha), p99(evalsha), 1, None, 1, None, None))


# --- this engine -------------------------------------------------------------------------------


def engine_rows(results: Results) -> None:
    cases = [(f"ratelimit_app {s}, 1 policy", [s]) for s in STRATEGIES]
    cases += [(f"ratelimit_app mixed, {n} policies", [STRATEGIES[i % 3] for i in range(n)]) for n in (3, 10)]
    for name, strategies in cases:
        checks = [Check(policy(s), subject(), HUGE) for s in strategies]
        decide = lambda checks=checks: engine.decide(checks)  # noqa: E731
        samples = latencies(decide, results.samples)
        trips, sent, commands = per_call(client(), decide, 200)

        def make(strategies=strategies):
            own = [Check(policy(s), subject(), HUGE) for s in strategies]
            return lambda: engine.decide(own)

        rate = throughput(make, seconds=results.seconds)
        exact = None
        if len(strategies) == 1:
            limited = policy(strategies[0], limit=100)

            def attempt(limited=limited):
                return lambda: engine.decide([Check(limited, subject(), 100)]).allowed

            exact = admitted(attempt)
        results.rows.append((name, p50(samples), p99(samples), trips, sent, commands, rate, exact))


def memory(results: Results) -> None:
    redis_client = client()
    for strategy, limit, attempts in (("fixed_window", 100, 300), ("sliding_window", 100, 300), ("sliding_log", 100, 300),
                                      ("sliding_log", 1000, 3000)):
        compiled = policy(strategy, limit=limit, window=60)
        who = subject(f"198.51.100.{_unique() % 250}")
        for i in range(attempts):  # spread over the window so the sliding window fills its buckets
            engine.decide([Check(compiled, who, limit)], now=1_800_000_000 + i * 59 / attempts)
        name = keys.counter_key(compiled, who.key)
        kind = redis_client.type(name).decode()
        entries = {"hash": redis_client.hlen, "zset": redis_client.zcard}.get(kind, lambda _: 1)(name)
        results.memory.append((strategy, limit, redis_client.memory_usage(name, samples=0), entries))


# --- peers -------------------------------------------------------------------------------------


def _drf_throttle(kind: str, rate: str):
    from rest_framework.request import Request
    from rest_framework.throttling import ScopedRateThrottle, UserRateThrottle

    class View:
        throttle_scope = "bench"

    base = ScopedRateThrottle if kind == "scoped" else UserRateThrottle

    class Throttle(base):
        cache = caches["default"]
        THROTTLE_RATES = {"bench": rate, "user": rate}

    drf_request = Request(request())
    drf_request.user = AnonymousUser()
    view = View()
    return lambda: Throttle().allow_request(drf_request, view)


def _django_ratelimit(rate: str, group: str):
    from django_ratelimit.core import is_ratelimited

    plain = request()
    return lambda: not is_ratelimited(plain, group=group, key="ip", rate=rate, increment=True)


def peer_rows(results: Results) -> None:
    try:
        import django_ratelimit  # noqa: F401
    except ImportError:
        results.notes.append("django-ratelimit is not installed (bench/requirements.txt): its rows are missing.")
        peers = []
    else:
        group = f"bench-{_unique()}"  # made here, so forked processes share one limit
        peers = [("django-ratelimit is_ratelimited", lambda rate: _django_ratelimit(rate, group))]
    peers = [
        ("DRF ScopedRateThrottle", lambda rate: _drf_throttle("scoped", rate)),
        ("DRF UserRateThrottle (anonymous: by IP)", lambda rate: _drf_throttle("user", rate)),
    ] + peers
    for name, build in peers:
        caches["default"].clear()
        operation = build("1000000000/hour")
        samples = latencies(operation, results.samples)
        trips, sent, commands = per_call(client(), operation, 200)
        rate = throughput(lambda build=build: build("1000000000/hour"), seconds=results.seconds)
        caches["default"].clear()
        exact = admitted(lambda build=build: build("100/hour"))
        results.rows.append((name, p50(samples), p99(samples), trips, sent, commands, rate, exact))


# --- Python overhead ---------------------------------------------------------------------------


def overhead(results: Results) -> None:
    from rest_framework.request import Request
    from rest_framework.views import APIView

    from ratelimit_app import policies
    from ratelimit_app.middleware import RateLimitMiddleware
    from ratelimit_app.throttling import PolicyThrottle

    saved = policy("fixed_window", action="demo:search", save=True)
    policies._state.stale = True
    def view(request):
        return HttpResponse("ok")

    middleware = RateLimitMiddleware(view)
    redis_client = client()
    script = scripts.scripts.get("decide", redis_client)
    who = subject()
    raw_keys = [keys.counter_key(saved, who.key), keys.live_key(saved), keys.totals_key(saved), keys.version_key()]
    raw_args = ["", "0", 2000, 1, saved.strategy, HUGE, saved.window_ms, saved.bucket_ms, "1", engine.live_member(who, HUGE, saved)]

    class ItemsView(APIView):
        throttle_scope = "demo:search"

    def drf_request():
        made = Request(request())
        made.user = AnonymousUser()
        return made

    throttle_view = ItemsView()
    paths = {
        "middleware": lambda pending: middleware(next(pending)),
        "view": lambda pending: view(next(pending)),
        "throttle": lambda pending: PolicyThrottle().allow_request(next(pending), throttle_view),
        "raw": lambda pending: script(raw_keys, raw_args, redis_client),
    }
    count = results.samples
    for name, call in paths.items():
        # fresh requests, made beforehand: a request is decided once, and making it is not ours to count
        pending = iter([drf_request() if name == "throttle" else request() for _ in range(3 * count + 600)])
        results.overhead[f"{name}_p50"] = p50(latencies(lambda: call(pending), count, warmup=300))
        results.overhead[f"{name}_cpu"] = cpu_per_call(lambda: call(pending), count, warmup=0)
        results.overhead[f"{name}_outside"] = outside_redis(lambda: call(pending), count, warmup=0)
    o = results.overhead
    o["middleware_overhead"] = o["middleware_outside"] - o["view_outside"]
    o["throttle_overhead"] = o["throttle_outside"]
    o["middleware_cpu_overhead"] = o["middleware_cpu"] - o["view_cpu"] - o["raw_cpu"]
    o["throttle_cpu_overhead"] = o["throttle_cpu"] - o["raw_cpu"]
    Policy.objects.filter(pk=saved.id).delete()


# --- end to end --------------------------------------------------------------------------------


def _serve(settings_module: str, env: dict) -> tuple[subprocess.Popen, int]:
    from project.devredis import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}", "--log-level", "warning", "project.wsgi"],
        cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": settings_module}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/demo/search/?q=a", timeout=2).read()
            return process, port
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("gunicorn did not start")


def _load(port: int, seconds: int) -> float:
    url = f"http://127.0.0.1:{port}/demo/search/?q=a"
    done = subprocess.run(["wrk", "-t2", "-c4", f"-d{seconds}s", url], capture_output=True, text=True, timeout=seconds + 30)
    for line in done.stdout.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(f"wrk printed no rate:\n{done.stdout}\n{done.stderr}")


def ensure_wrk(results: Results) -> bool:
    if shutil.which("wrk"):
        return True
    installed = subprocess.run("apt-get update -qq && apt-get install -y -qq wrk", shell=True, capture_output=True)
    if installed.returncode or not shutil.which("wrk"):
        results.notes.append("wrk could not be installed (apt-get install wrk): end-to-end rows are missing.")
        return False
    return True


def end_to_end(results: Results) -> None:
    if not ensure_wrk(results):
        return
    env = dict(os.environ)
    configurations = [
        ("middleware off", "bench.settings_nolimit", []),
        ("1 policy", "project.settings", [("demo:search", "fixed_window")]),
        ("3 policies", "project.settings", [("demo:search", "fixed_window"), ("/demo/", "sliding_window"), ("*", "sliding_log")]),
    ]
    for name, settings_module, wanted in configurations:
        Policy.objects.all().delete()
        for action, strategy in wanted:
            policy(strategy, action=action, save=True)
        process, port = _serve(settings_module, env)
        try:
            _load(port, 1)  # warm up both workers
            results.e2e[name] = _load(port, results.e2e_seconds)
        finally:
            process.terminate()
            process.wait(timeout=10)
    Policy.objects.all().delete()


def versions(results: Results) -> None:
    import platform
    from importlib.metadata import version

    info = client().info("server")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    results.versions = {
        "machine": f"{os.cpu_count()} cores, {cpu}",
        "python": platform.python_version(),
        "redis server": f"{info['redis_version']} ({info.get('executable') or 'external'})",
        **{name: version(name) for name in ("django", "djangorestframework", "django-redis", "redis")},
    }
    try:
        results.versions["django-ratelimit"] = version("django-ratelimit")
    except Exception:  # noqa: BLE001 - only informative
        pass


def run_all(quick: bool = False) -> Results:
    results = Results(samples=500 if quick else 5000, seconds=0.5 if quick else 2.0)
    versions(results)
    client().flushdb()
    floors(results)
    engine_rows(results)
    memory(results)
    peer_rows(results)
    overhead(results)
    if not quick:
        end_to_end(results)
    return results
