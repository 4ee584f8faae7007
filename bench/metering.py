"""Metered usage's cost: a request through the middleware whose view settles what it used, beside one of a
policy counting requests (round trips, bytes, server-side commands, p50), and a settle's own cost.

python -m bench.metering prints its section of bench/RESULTS.md alone (REDIS_URL: a server it may flush)."""

from __future__ import annotations

import itertools
from functools import partial

if __name__ == "__main__":  # run alone: the bench's settings and database before Django is imported
    from bench.__main__ import WORK, configure

    configure(WORK)

from django.http import HttpResponse

import ratelimit_app
from bench.common import Results, client, policy, request, server, subject
from bench.measure import Wire, interleaved_latencies, p50, server_work
from ratelimit_app import engine, policies
from ratelimit_app.engine import Check
from ratelimit_app.engine.giveback import carried
from ratelimit_app.engine.settling import settle_commands
from ratelimit_app.engine.tally import tally
from ratelimit_app.models import Policy
from ratelimit_app.values import Adjustment

PATHS = {"unmetered": "/bench-plain/", "as estimated": "/bench-meter/", "settled": "/bench-meter/"}
AMOUNTS = itertools.cycle(range(2, 52))  # what a view that settles another amount than its estimate (1) used
SETTLED_STRATEGIES = ("fixed_window", "sliding_window", "token_bucket", "calendar_quota")


def metering(results: Results) -> None:
    from ratelimit_app.middleware import RateLimitMiddleware

    saved = [policy("fixed_window", action="/bench-plain/", save=True),
             policy("fixed_window", action="/bench-meter/", save=True, unit="tokens")]
    policies._state.stale = True
    routes = {name: RateLimitMiddleware(_settling(name)) for name in PATHS}
    for name, middleware in routes.items():
        middleware(request(path=PATHS[name]))  # loads the index and the scripts
    count = results.samples
    figures = {}
    for name, middleware in routes.items():
        figures[name] = _per_request(middleware, PATHS[name], count)
    # fresh requests made beforehand, measured in alternating slices: the machine's load weighs on each alike
    pending = {name: iter([request(path=PATHS[name]) for _ in range(count + 200)]) for name in routes}
    timed = interleaved_latencies({name: partial(_serve, middleware, pending[name]) for name, middleware in
                                   routes.items()}, count)
    for name, samples in timed.items():
        figures[name]["p50"] = p50(samples)
    carried.send()
    for row in saved:
        Policy.objects.filter(pk=row.id).delete()
    results.metering = {"requests": figures, "settle": {s: _settle_cost(s, count) for s in SETTLED_STRATEGIES}}


def _serve(middleware, pending) -> None:
    middleware(next(pending))


def _settling(name: str):
    def view(made):
        if name != "unmetered":
            ratelimit_app.settle(made, tokens=1 if name == "as estimated" else next(AMOUNTS))
        return HttpResponse("ok")

    return view


def _per_request(middleware, path: str, count: int) -> dict:
    """Round trips and bytes this thread sent per request, and the commands Redis ran for it (INFO
    commandstats). A settle waits for the thread's next write (the next request's decision): the last
    one is sent after the loop, counted on the server, not on the wire."""
    pending = [request(path=path) for _ in range(count)]
    tally.flush()
    with tally._flushing:  # the totals' flush is no request's work
        client().config_resetstat()
        before = server_work(server())
        wire = Wire()
        with wire.watching():
            for made in pending:
                middleware(made)
        carried.send()
        after = server_work(server())
    return {"trips": wire.trips / count, "bytes": wire.bytes / count,
            "commands": (after[0] - before[0]) / count, "script_us": (after[1] - before[1]) / count}


def _settle_cost(strategy: str, count: int) -> dict:
    """A settle of one policy by itself, as the closing step writes it (settle.lua's EVAL): the commands
    Redis runs for it, the script's time, the bytes written."""
    terms = {"limit": 10**9, "window": 31 * 86400} if strategy == "calendar_quota" else {"limit": 10**9}
    limited = policy(strategy, unit="tokens", **terms)
    charged = engine.decide([Check(limited, subject(), limited.limit)], cost=10).metered[0]
    [(_key, command, _group)] = settle_commands([Adjustment(charged, 5)], None)
    redis_client = client()
    redis_client.execute_command(*command)  # the script loaded
    tally.flush()
    with tally._flushing:
        redis_client.config_resetstat()
        before = server_work(server())
        for _ in range(count):
            redis_client.execute_command(*command)
        after = server_work(server())
    packed = b"".join(redis_client.connection_pool.get_encoder().encode(part) if isinstance(part, str) else
                      part if isinstance(part, bytes) else str(part).encode() for part in command)
    return {"commands": (after[0] - before[0]) / count, "script_us": (after[1] - before[1]) / count,
            "bytes": len(packed)}


def lines(results: Results) -> list[str]:
    """The section of RESULTS.md."""
    figures = results.metering
    out = ["", "## Metered usage", ""]
    if not isinstance(figures, dict):
        return out + [f"{figures}."]
    out += [
        "A request through the middleware, one fixed-window policy: counting requests, or counting tokens "
        "(admitted on an estimate of 1) with a view that settles 1 (its estimate: nothing to move) or 2 to 51. "
        "A settle makes no round trip of its own: it is written with the thread's next command (the next "
        "request's decision), or by a timer within a second. Round trips and bytes: what the request's thread "
        "sent; commands: what Redis ran per request (INFO commandstats, a script counted with each command it "
        "runs).",
        "",
        "| request | round trips | bytes sent | server-side commands | script us | p50 us |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, label in (("unmetered", "counting requests"), ("as estimated", "counting tokens, settles its estimate"),
                        ("settled", "counting tokens, settles another amount")):
        row = figures["requests"][name]
        out.append(f"| {label} | {row['trips']:.2f} | {row['bytes']:.0f} | {row['commands']:.2f} | "
                   f"{row['script_us']:.1f} | {row['p50']:.1f} |")
    out += [
        "",
        "A settle's own cost, one policy: settle.lua's EVAL as the closing step writes it, run alone.",
        "",
        "| strategy | server-side commands | script us | bytes written | round trips of its own |",
        "|---|---:|---:|---:|---:|",
    ]
    for strategy, row in figures["settle"].items():
        out.append(f"| {strategy} | {row['commands']:.2f} | {row['script_us']:.1f} | {row['bytes']} | 0 |")
    return out


def budgets(results: Results):
    figures = results.metering
    label = "round trips per metered request (tokens, settled) <= one counting requests"
    if not isinstance(figures, dict):
        yield label, figures, "n/a"
        return
    metered = max(figures["requests"][name]["trips"] for name in ("as estimated", "settled"))
    unmetered = figures["requests"]["unmetered"]["trips"]
    yield label, f"{metered:.2f} against {unmetered:.2f}", "PASS" if metered <= unmetered else "**MISS**"
    # a settle runs 3 commands or more: a fraction above is the server's own chores, not a settle sent
    label = "a request that settles its estimate sends no settle: server-side commands < 1 more than one counting requests"
    as_estimated, plain = figures["requests"]["as estimated"]["commands"], figures["requests"]["unmetered"]["commands"]
    yield label, f"{as_estimated:.2f} against {plain:.2f}", "PASS" if as_estimated < plain + 1 else "**MISS**"


if __name__ == "__main__":
    import sys

    measured = Results(quick="--quick" in sys.argv, samples=200 if "--quick" in sys.argv else 5000)
    server().flushdb()
    metering(measured)
    print("\n".join(lines(measured)))
    print("\n| budget | measured | verdict |\n|---|---|---|")
    print("\n".join(f"| {b} | {m} | {v} |" for b, m, v in budgets(measured)))
