"""The decision measurements of `make bench` (ours beside the peers: limits, DRF, django-ratelimit,
django-smart-ratelimit), the spread workload, memory per subject, and run_all, which runs every part in order."""

from __future__ import annotations

import importlib
import os
import sys
import time
from functools import partial
from typing import Callable, NamedTuple

import redis
from django.core.cache import caches
from django.test.utils import override_settings

from bench import e2e, metering, paths, scale, scripts_memory
from bench.common import (HUGE, STRATEGIES, Results, Row, Spread, client, decide, decider, policy, request, server,
                          subject, unique)
from bench.measure import admitted, interleaved_latencies, p50, p99, per_call, server_work, spread, throughput
from ratelimit_app import engine, strategies
from ratelimit_app.engine import keys
from ratelimit_app.rates import MAX_WINDOW
from ratelimit_app.models import Policy

MIXES = (3, 10)  # policies per request in the mixed rows
# A token bucket whose burst is in use on every decision after a subject's first: one request per
# 31.6 s sustained (10^6 a year), so any repeat within the run spends the burst, which the bench
# never exhausts (500,000).
BURST_TERMS = {"limit": 1_000_000, "window": MAX_WINDOW, "burst": 500_000}
BURST_ROW = "ratelimit_app token_bucket, burst in use, 1 policy"
COST_ROW = "ratelimit_app fixed_window, cost 3, 1 policy"
SPREAD_SUBJECTS = 1_000
SMART = "django-smart-ratelimit fixed window (RedisBackend)"


class Contender(NamedTuple):
    """One line of the decisions table: how to make its operation (again in each forked process),
    and how to make an attempt against a fresh limit of 100 for the exactness column."""

    name: str
    kind: str  # "floor", "ours" or "peer"
    make: Callable[[], Callable[[], object]]
    attempt: Callable[[], Callable[[], bool]] | None = None
    strategies: tuple[str, ...] = ()
    refused: Callable[[], Callable[[], object]] | None = None  # against a limit of 1: repeats are refused
    # the spread workload: called once per round before forking (fresh limits: every subject's first
    # decision is in the round), what it returns is called in each process for the operation on subject i
    spread: Callable[[], Callable[[], Callable[[int], object]]] | None = None


# --- which strategies the engine decides ------------------------------------------------------


def probe_strategies(results: Results) -> None:
    """Strategies the model offers but the engine cannot decide yet show as n/a, with the reason."""
    for strategy in STRATEGIES:
        try:  # both shapes the rows use: a limit never reached, and a small one
            for limit, window in ((HUGE, 3600), (100, 60)):
                decide([policy(strategy, limit=limit, window=window)], subject("192.0.2.1"))
        except Exception as error:  # noqa: BLE001 - any failure means "not decidable yet"; the reason is printed
            results.unsupported[strategy] = f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
        finally:
            engine.breaker.reset()  # a script error opened the circuit: later rows must not see it


# --- contenders --------------------------------------------------------------------------------


TRIVIAL_FUNCTION = "#!lua name=bench\nredis.register_function('bench_one', function() return 1 end)"


def floors(results: Results) -> list[Contender]:
    def ping():
        return client().ping

    def trivial_script():
        redis_client = client()
        script = redis_client.register_script("return 1")
        return lambda: script([], [], redis_client)

    contenders = [Contender("floor: PING", "floor", ping), Contender("floor: EVALSHA `return 1`", "floor", trivial_script)]
    try:  # Redis Functions (Redis >= 7, Valkey): is FCALL any cheaper than EVALSHA here?
        client().function_load(TRIVIAL_FUNCTION, replace=True)
    except redis.ResponseError as error:
        results.notes.append(f"no FCALL floor: this server has no Redis Functions ({error})")
    else:
        contenders.append(Contender("floor: FCALL `return 1`", "floor", lambda: lambda: client().fcall("bench_one", 0)))
    return contenders


def ours(results: Results) -> list[Contender]:
    decidable = results.decidable()
    contenders = [
        Contender(f"ratelimit_app {s}, 1 policy", "ours", partial(_deciding, (s,)), partial(_attempting, policy(s, limit=100)), (s,),
                  refused=None if strategies.get(s).holds else partial(_deciding, (s,), limit=1),
                  spread=partial(_spreading, (s,)) if s == "fixed_window" else None)
        for s in decidable
    ]
    if "fixed_window" in decidable:  # what a request worth 3 units costs beside one worth 1
        contenders.append(Contender(COST_ROW, "ours", partial(_deciding, ("fixed_window",), cost=3), None, ("fixed_window",)))
    if "token_bucket" in decidable:
        contenders.append(Contender(BURST_ROW, "ours", partial(_deciding, ("token_bucket",), **BURST_TERMS), None,
                                    ("token_bucket",), spread=partial(_spreading, ("token_bucket",), **BURST_TERMS)))
    counting = [s for s in decidable if not strategies.get(s).holds]  # in-flight rows also give places back
    for n in MIXES:
        mix = tuple(counting[i % len(counting)] for i in range(n))
        contenders.append(Contender(f"ratelimit_app mixed, {n} policies", "ours", partial(_deciding, mix), None, mix,
                                    spread=partial(_spreading, mix) if n == 10 else None))
    return contenders


def _deciding(names: tuple[str, ...], cost: int = 1, **terms) -> Callable[[], object]:
    return decider([policy(s, **terms) for s in names], subject(), cost)


def spread_addresses() -> list[str]:
    return [f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}" for n in range(SPREAD_SUBJECTS)]


def _spreading(strategies: tuple[str, ...], **terms) -> Callable[[], Callable[[int], object]]:
    made = [policy(s, **terms) for s in strategies]  # before forking: both processes count the same policies

    def make() -> Callable[[int], object]:
        decisions = [decider(made, subject(address)) for address in spread_addresses()]
        decider(made, subject("192.0.2.250"))()  # connected, the scripts loaded: not a subject of the run
        return lambda who: decisions[who]()

    return make


def _attempting(limited) -> Callable[[], bool]:
    # `limited` was made before forking: every process counts against the same policy
    who = subject()
    return lambda: decide([limited], who).allowed


def _limits(strategy: str, rate: str, namespace: str, spread: bool = False):
    from limits import parse, storage, strategies

    limiter = {"fixed": strategies.FixedWindowRateLimiter, "moving": strategies.MovingWindowRateLimiter}[strategy]
    item = parse(rate)
    store = storage.RedisStorage(os.environ["REDIS_URL"])
    hit = limiter(store).hit
    if spread:
        addresses = spread_addresses()
        hit(item, namespace, "192.0.2.250")  # connected: not a subject of the run
        return lambda who: hit(item, namespace, addresses[who])
    return lambda: hit(item, namespace, "203.0.113.7")


def _smart_backend():
    """django-smart-ratelimit's Redis backend on the same server, counting in fixed windows (its
    settings are read when the backend is made; RATELIMIT_KEY_PREFIX is ours too, "rl")."""
    from django_smart_ratelimit.backends.redis_backend import RedisBackend

    from bench.settings_e2e import smart_ratelimit_redis

    with override_settings(RATELIMIT_BACKEND="redis", RATELIMIT_REDIS=smart_ratelimit_redis(os.environ["REDIS_URL"]),
                           RATELIMIT_ALGORITHM="fixed_window"):
        return RedisBackend()


def _smart(rate: str, namespace: str, spread: bool = False):
    """What its decorator does to decide: check_rate_limit (INCR in its script, then the reset time)."""
    from django_smart_ratelimit.context import RateLimitContext
    from django_smart_ratelimit.decorator import check_rate_limit
    from django_smart_ratelimit.utils import parse_rate

    backend = _smart_backend()
    limit, period = parse_rate(rate)
    plain = request()

    def decide_for(address: str) -> bool:
        return check_rate_limit(RateLimitContext(request=plain, key=f"{namespace}:ip:{address}", limit=limit, period=period),
                                backend).allowed

    if spread:
        addresses = spread_addresses()
        decide_for("192.0.2.250")  # connected: not a subject of the run
        return lambda who: decide_for(addresses[who])
    return lambda: decide_for("203.0.113.7")


def _drf_throttle(kind: str, rate: str, ip: str = "203.0.113.7"):
    from django.contrib.auth.models import AnonymousUser
    from rest_framework.request import Request
    from rest_framework.throttling import ScopedRateThrottle, UserRateThrottle

    class View:
        throttle_scope = "bench"

    base = ScopedRateThrottle if kind == "scoped" else UserRateThrottle

    class Throttle(base):
        cache = caches["default"]
        THROTTLE_RATES = {"bench": rate, "user": rate}

    drf_request = Request(request(ip))
    drf_request.user = AnonymousUser()
    view = View()
    return lambda: Throttle().allow_request(drf_request, view)


def _django_ratelimit(rate: str, group: str):
    from django_ratelimit.core import is_ratelimited

    plain = request()
    return lambda: not is_ratelimited(plain, group=group, key="ip", rate=rate, increment=True)


def peers(results: Results) -> list[Contender]:
    contenders = []
    try:
        import limits  # noqa: F401
    except ImportError:
        results.notes.append("limits is not installed (bench/requirements.txt): its rows are missing.")
    else:
        for strategy, label in (("fixed", "fixed window"), ("moving", "moving window")):
            spaces = (f"bench-{unique()}", f"bench-{unique()}")  # made here, so forked processes share one limit
            contenders.append(Contender(
                f"limits {label} (RedisStorage)", "peer",
                lambda strategy=strategy, space=spaces[0]: _limits(strategy, f"{HUGE}/hour", space),
                lambda strategy=strategy, space=spaces[1]: _limits(strategy, "100/hour", space),
                refused=lambda strategy=strategy: _limits(strategy, "1/hour", f"bench-{unique()}"),
                spread=(lambda: partial(_limits, "fixed", f"{HUGE}/hour", f"bench-{unique()}", True)) if strategy == "fixed" else None,
            ))
    contenders += [
        # DRF keys its history by scope and address only: the exactness attempts come from other addresses
        Contender("DRF ScopedRateThrottle", "peer", lambda: _drf_throttle("scoped", f"{HUGE}/hour"),
                  lambda: _drf_throttle("scoped", "100/hour", "203.0.113.8"),
                  refused=lambda: _drf_throttle("scoped", "1/hour", "203.0.113.10")),
        Contender("DRF UserRateThrottle (anonymous: by IP)", "peer", lambda: _drf_throttle("user", f"{HUGE}/hour"),
                  lambda: _drf_throttle("user", "100/hour", "203.0.113.9"),
                  refused=lambda: _drf_throttle("user", "1/hour", "203.0.113.11")),
    ]
    groups = (f"bench-{unique()}", f"bench-{unique()}")
    contenders += _installed(results, "django_ratelimit", "django-ratelimit", lambda: Contender(
        "django-ratelimit is_ratelimited", "peer",
        lambda: _django_ratelimit(f"{HUGE}/h", groups[0]), lambda: _django_ratelimit("100/h", groups[1]),
        refused=lambda: _django_ratelimit("1/h", f"bench-{unique()}"),
    ))
    spaces = (f"bench-{unique()}", f"bench-{unique()}")
    contenders += _installed(results, "django_smart_ratelimit", "django-smart-ratelimit", lambda: Contender(
        SMART, "peer", lambda: _smart(f"{HUGE}/h", spaces[0]), lambda: _smart("100/h", spaces[1]),
        refused=lambda: _smart("1/h", f"bench-{unique()}"),
        spread=lambda: partial(_smart, f"{HUGE}/h", f"bench-{unique()}", True),
    ))
    return contenders


def _installed(results: Results, module: str, package: str, contender: Callable[[], Contender]) -> list[Contender]:
    """A peer's row when its package is installed; a note saying its rows are missing otherwise."""
    try:
        importlib.import_module(module)
    except ImportError:
        results.notes.append(f"{package} is not installed (bench/requirements.txt): its rows are missing.")
        return []
    return [contender()]


# --- the decisions table -----------------------------------------------------------------------


def _refused_once(make: Callable[[], Callable[[], object]]) -> Callable[[], object]:
    """A call against a limit of 1 whose limit is already reached: per_call's own first call is the
    first refusal, so every call it counts is a refused repeat (not the first, which marks the subject)."""
    operation = make()
    operation()
    return operation


def decisions(results: Results) -> None:
    """Every contender measured in the same run: latencies interleaved, throughput in alternating
    rounds, so that the machine's load weighs on all of them alike."""
    contenders = floors(results) + ours(results) + peers(results)
    operations = {c.name: c.make() for c in contenders}
    samples = interleaved_latencies(operations, results.samples)
    redis_client = client()
    wire = {c.name: per_call(redis_client, operations[c.name], 200) for c in contenders}
    with override_settings(RATELIMIT_DENY_CACHE=False):  # engine.decide never asks it; said here all the same
        refused = {c.name: per_call(redis_client, _refused_once(c.refused), 200)[2] for c in contenders if c.refused}
    rates = {c.name: 0.0 for c in contenders if c.kind != "floor"}
    rounds = 1 if results.quick else 4  # short alternating rounds: a burst of load elsewhere hits every row
    for number in range(rounds):
        order = [c for c in contenders if c.kind != "floor"]
        for contender in order if number % 2 == 0 else reversed(order):
            rates[contender.name] += throughput(contender.make, seconds=results.seconds / rounds) / rounds
    for contender in contenders:
        exact = admitted(contender.attempt) if contender.attempt else None
        trips, sent, commands = wire[contender.name]
        if contender.kind == "floor":
            sent = None
        taken = samples[contender.name]
        results.rows.append(Row(contender.name, contender.kind, contender.strategies, p50(taken), p99(taken), trips, sent,
                                commands, rates.get(contender.name), exact, refused.get(contender.name)))
    results.floors = {"ping_p50": results.rows[0].p50, "evalsha_p50": results.rows[1].p50}


def _pinging() -> Callable[[int], object]:
    redis_client = client()
    redis_client.ping()  # connected
    return lambda who: redis_client.ping()


def spread_workload(results: Results) -> None:
    """2 processes x 10,000 decisions (results.spread_decisions) over 1,000 subjects, each contender with fresh limits in each
    round (every subject's first decision is in it), rows in alternating rounds; server-side commands
    and microseconds over the whole run from INFO commandstats, the server's CPU from INFO cpu."""
    ping = Contender("floor: PING", "floor", lambda: None, spread=lambda: _pinging)
    contenders = [ping] + [c for c in ours(results) + peers(results) if c.spread]
    results.notes = list(dict.fromkeys(results.notes))  # peers() said what is missing once already
    totals = {c.name: {"seconds": 0.0, "samples": [], "work": [0, 0, 0, 0.0]} for c in contenders}
    redis_client = server()
    for number in range(results.spread_rounds):
        for contender in contenders if number % 2 == 0 else reversed(contenders):
            make = contender.spread()
            before = server_work(redis_client)
            rate, samples = spread(make, decisions=results.spread_decisions, subjects=SPREAD_SUBJECTS)
            after = server_work(redis_client)
            total = totals[contender.name]
            total["seconds"] += 2 * results.spread_decisions / rate
            total["samples"] += samples
            total["work"] = [sum_ + a - b for sum_, a, b in zip(total["work"], after, before)]
    for contender in contenders:
        total = totals[contender.name]
        decisions = 2 * results.spread_decisions * results.spread_rounds
        commands, script_usec, other_usec, redis_cpu = total["work"]
        results.spread.append(Spread(contender.name, contender.kind, p50(total["samples"]), decisions / total["seconds"],
                                     commands / decisions, script_usec / decisions, other_usec / decisions,
                                     redis_cpu * 1e6 / decisions))


def memory(results: Results) -> None:
    """MEMORY USAGE of the keys carrying one subject's hash (its counters), after filling its window."""
    redis_client = server()
    cases = [(s, 100, 300) for s in results.decidable()]
    if "sliding_log" in results.decidable():
        cases.append(("sliding_log", 1000, 3000))
    for number, (strategy, limit, attempts) in enumerate(cases):
        # saved: its id is the database's, as short as a site's (a made-up id of 7 to 10 digits would
        # lengthen every key, and at 30 characters a key passes one of Redis' allocation sizes)
        compiled = policy(strategy, limit=limit, window=60, save=True)
        who = subject(f"198.51.100.{number + 1}")  # one subject per case: a shared one adds up two cases' keys
        for i in range(attempts):  # spread over the window so that the sliding window fills its buckets
            decide([compiled], who, now=1_800_000_000 + i * 59 / attempts)
        pattern = "*" + "".join(f"[{c}]" if c in "*?[]\\" else c for c in keys.subject_part(who.key)) + "*"
        names = [name for name in redis_client.scan_iter(match=pattern, count=1000)]
        size = sum(redis_client.memory_usage(name, samples=0) or 0 for name in names)
        entries = sum(_entries(redis_client, name) for name in names)
        results.memory.append((strategy, limit, size, entries))
        Policy.objects.filter(pk=compiled.id).delete()


def _entries(redis_client, name) -> int:
    kind = redis_client.type(name).decode()
    return {"hash": redis_client.hlen, "zset": redis_client.zcard, "list": redis_client.llen}.get(kind, lambda _: 1)(name)


def versions(results: Results) -> None:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    info = server().info("server")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    results.load_start = os.getloadavg()[0]
    results.versions = {
        "machine": f"{os.cpu_count()} cores, {cpu}, load average {results.load_start:.1f} at the start",
        "python": platform.python_version(),
        "redis server": f"{info['redis_version']} ({info.get('executable') or 'external'})",
    }
    for name in ("django", "djangorestframework", "django-redis", "redis", "hiredis", "limits", "django-ratelimit",
                 "django-smart-ratelimit", "gunicorn", "uvicorn"):
        try:
            results.versions[name] = version(name)
        except PackageNotFoundError:
            results.versions[name] = "not installed"


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the processes it waited for (forked measurers, servers, load)."""
    import resource

    return sum(usage.ru_utime + usage.ru_stime
               for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def run_all(quick: bool = False) -> Results:
    # a quick run is a smoke test: every part and row runs, briefly (its figures are no comparison)
    results = Results(quick=quick, samples=200 if quick else 5000, seconds=0.02 if quick else 2.0)
    if quick:
        results.e2e_seconds, results.e2e_rounds, results.e2e_floor_rounds, results.spread_rounds = 1.0, 1, 1, 1
        results.spread_decisions = 2_000  # every subject still decided twice a process
    versions(results)
    server().flushdb()
    parts = [
        ("strategies", probe_strategies), ("decisions", decisions), ("spread workload", spread_workload),
        ("memory", memory), ("scripts' memory", scripts_memory.scripts_memory), ("overhead", paths.overhead),
        ("async", paths.asynchronous), ("deny cache", paths.deny_cache), ("metered usage", metering.metering),
        ("live page", lambda results: scale.live_page(results, subjects=20_000 if quick else 1_000_000)),
        ("cluster", scale.cluster), ("end to end", e2e.end_to_end),
    ]
    for name, part in parts:
        started, cpu = time.monotonic(), _cpu_seconds()
        print(f"bench: {name}...", end=" ", file=sys.stderr, flush=True)
        part(results)
        server().flushdb()  # each part starts from an empty server (the live page leaves a million keys)
        print(f"{time.monotonic() - started:.0f} s ({_cpu_seconds() - cpu:.0f} s of CPU)", file=sys.stderr, flush=True)
    busiest = max(results.load_start, os.getloadavg()[0])
    if busiest > (os.cpu_count() or 1):
        results.notes.append(
            f"measured on a busy machine (load average up to {busiest:.1f} on {os.cpu_count()} cores): absolute figures, "
            "throughput and the end-to-end ratios are noisy; re-run on a quiet machine before drawing conclusions."
        )
    return results
