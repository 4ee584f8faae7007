"""The doors' own cost: Python around the round trip on the middleware, DRF throttle and async paths,
and the local deny cache's effect on the Redis calls of a flood."""

from __future__ import annotations

from typing import Iterator

from asgiref.sync import iscoroutinefunction
from django.contrib.auth.models import AnonymousUser
from django.http import HttpResponse
from django.test.utils import override_settings

from bench.common import Results, policy, request
from bench.measure import Wire, async_outside_redis, cpu_per_call, latencies, outside_redis, p50, recording_commands
import ratelimit_app
from ratelimit_app import conf, limiter, policies
from ratelimit_app.engine import decision_connection
from ratelimit_app.models import Policy

DECISION_COMMANDS = (b"EVALSHA", b"EVAL", b"FCALL", b"EVALSHA_RO", b"FCALL_RO")


def view(request):
    return HttpResponse("ok")


async def async_view(request):
    return HttpResponse("ok")


def handed_out(requests: list) -> Iterator:
    """Each request once, let go of as it is handed out: a server frees a request once answered, and
    a list keeping them all would leave its work to the garbage collector on the measured calls."""
    requests.reverse()
    while requests:
        yield requests.pop()


def _decision_command(operation) -> tuple:
    """The arguments of the command `operation` sends to decide (to replay it without any door)."""
    with recording_commands() as sent:
        operation()
    commands = [args for _, args in sent if str(args[0]).upper().encode() in DECISION_COMMANDS]
    if not commands:
        raise RuntimeError(f"no decision command among {[args[0] for _, args in sent]}")
    return commands[-1]


def overhead(results: Results) -> None:
    from rest_framework.request import Request
    from rest_framework.views import APIView

    from ratelimit_app.middleware import RateLimitMiddleware
    from ratelimit_app.throttling import PolicyThrottle

    saved = policy("fixed_window", action="demo:search", save=True)
    policies._state.stale = True
    middleware = RateLimitMiddleware(view)
    middleware(request())  # loads the policy index
    decision = _decision_command(lambda: middleware(request()))

    class ItemsView(APIView):
        throttle_scope = "demo:search"

    def drf_request():
        made = Request(request())
        made.user = AnonymousUser()
        return made

    throttle_view = ItemsView()
    routes = {
        "middleware": lambda pending: middleware(next(pending)),
        "view": lambda pending: view(next(pending)),
        "throttle": lambda pending: PolicyThrottle().allow_request(next(pending), throttle_view),
        # the same command, as the engine sends it (on this thread's kept connection)
        "raw": lambda pending: decision_connection.execute(decision_connection.decision_client(), *decision),
    }
    count = results.samples
    for name, call in routes.items():
        # fresh requests, made beforehand: a request is decided once, and making it is not ours to count
        pending = handed_out([drf_request() if name == "throttle" else request() for _ in range(3 * count + 600)])
        results.overhead[f"{name}_p50"] = p50(latencies(lambda: call(pending), count, warmup=300))
        results.overhead[f"{name}_cpu"] = cpu_per_call(lambda: call(pending), count, warmup=0)
        median, mean = outside_redis(lambda: call(pending), count, warmup=0)
        results.overhead[f"{name}_outside"], results.overhead[f"{name}_mean"] = median, mean
    o = results.overhead
    o["middleware_overhead"] = o["middleware_outside"] - o["view_outside"]
    o["throttle_overhead"] = o["throttle_outside"]
    o["middleware_cpu_overhead"] = o["middleware_cpu"] - o["view_cpu"] - o["raw_cpu"]
    o["throttle_cpu_overhead"] = o["throttle_cpu"] - o["raw_cpu"]
    Policy.objects.filter(pk=saved.id).delete()


def asynchronous(results: Results) -> None:
    """The async doors, when they exist: `ahit` and the middleware around an async view (as under ASGI)."""
    from ratelimit_app.middleware import RateLimitMiddleware

    saved = policy("fixed_window", action="demo:search", save=True)
    policies._state.stale = True
    policies.get_index()  # loaded here, outside the event loop: reading the database is not what is measured
    count = results.samples
    operations = {}
    ahit = getattr(limiter, "ahit", None) or getattr(ratelimit_app, "ahit", None)
    if ahit is None:
        results.asynchronous["ahit"] = "n/a (ratelimit_app.limiter.ahit does not exist yet)"
    else:
        pending_hits = handed_out([request() for _ in range(2 * count + 400)])
        operations["ahit"] = lambda: ahit(next(pending_hits), "demo:search")
    middleware = RateLimitMiddleware(async_view)
    if not (getattr(RateLimitMiddleware, "async_capable", False) and iscoroutinefunction(middleware)):
        results.asynchronous["middleware"] = "n/a (RateLimitMiddleware is not async-capable yet)"
    else:
        pending_views, pending_middleware = (handed_out([request() for _ in range(2 * count + 400)]) for _ in range(2))
        operations["view"] = lambda: async_view(next(pending_views))
        operations["middleware"] = lambda: middleware(next(pending_middleware))
    if operations:
        measured = async_outside_redis(operations, count)
        for name, (outside, mean, median) in measured.items():
            if name != "view":
                own = measured["view"][0] if name == "middleware" else 0.0
                results.asynchronous[name] = {"outside": outside, "mean": mean, "p50": median, "overhead": outside - own}
    Policy.objects.filter(pk=saved.id).delete()


def deny_cache(results: Results, limit: int = 100) -> None:
    """A flood of one subject at 10x its limit through the middleware, deny cache off then on: Redis
    calls (round trips) for the requests within the limit and for those over it."""
    from ratelimit_app.middleware import RateLimitMiddleware

    if "RATELIMIT_DENY_CACHE" not in conf.DEFAULTS:
        results.deny_cache = "n/a (no deny cache: the setting RATELIMIT_DENY_CACHE does not exist yet)"
        return
    saved = policy("fixed_window", limit=limit, window=3600, action="/bench-flood/", save=True)
    policies._state.stale = True
    middleware = RateLimitMiddleware(view)
    runs = {}
    for number, enabled in enumerate((False, True)):
        with override_settings(RATELIMIT_DENY_CACHE=enabled):
            middleware(request("198.51.100.200", "/bench-flood/"))  # another subject: loads the index
            flooding = f"192.0.2.{20 + number}"
            within, over = Wire(), Wire()
            with within.watching():
                statuses = [middleware(request(flooding, "/bench-flood/")).status_code for _ in range(limit)]
            with over.watching():
                statuses += [middleware(request(flooding, "/bench-flood/")).status_code for _ in range(9 * limit)]
        runs[enabled] = {"admitted": statuses.count(200), "refused": statuses.count(429), "within": within.trips,
                         "over": over.trips}
    Policy.objects.filter(pk=saved.id).delete()
    results.deny_cache = {"limit": limit, "requests": 10 * limit, "off": runs[False], "on": runs[True]}
