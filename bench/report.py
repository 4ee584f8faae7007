"""The Markdown table of `make bench`, with each budget of DESIGN.md marked PASS or MISS."""

from __future__ import annotations

import datetime

from bench.suites import Results


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "**MISS**"


def render(results: Results) -> str:
    ping = results.floors["ping_p50"]
    lines = [
        "# Benchmark results",
        "",
        f"Run {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} with `make bench`, everything against one Redis "
        "server in this run.",
        "",
        *[f"- {name}: {value}" for name, value in results.versions.items()],
        "",
        "## Decisions",
        "",
        "p50/p99 in microseconds per decision through redis-py (the engine's whole `decide()` for ours); "
        "round trips and bytes counted on redis-py's connection; server commands from INFO commandstats "
        "(a Lua script counts itself and every command it runs); decisions/s with 2 processes; admitted = "
        "8 processes x 100 attempts against a fresh limit of 100 (exact: 100).",
        "",
        "| what | p50 us | p99 us | p50 / PING | round trips | bytes sent | server cmds | decisions/s (2 procs) | admitted of 800 (limit 100) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p50, p99, trips, sent, commands, rate, exact in results.rows:
        lines.append(
            f"| {name} | {_num(p50)} | {_num(p99)} | {p50 / ping:.2f} | {_num(trips, 2)} | {_num(sent, 0)} | "
            f"{_num(commands, 1)} | {_num(rate, 0)} | {_num(exact)} |"
        )
    lines += ["", "## Memory per subject (MEMORY USAGE after filling the window)", "",
              "| strategy | limit | bytes | entries |", "|---|---:|---:|---:|"]
    lines += [f"| {s} | {limit} | {size} | {entries} |" for s, limit, size, entries in results.memory]
    o = results.overhead
    lines += [
        "",
        "## Python overhead (microseconds per request)",
        "",
        "Measured three ways over the same fresh requests. *Outside the round trip*: wall time of the path minus "
        "the time spent inside redis-py's script call (packing, network, Redis, parsing), i.e. exactly the "
        "Python the path adds around its one round trip; this is the budget's figure. *User CPU*: os.times "
        "per call (10 ms ticks, noisier). *p50*: wall clock including the round trip, for reference.",
        "",
        "| path | outside the round trip us | user CPU us | p50 us |",
        "|---|---:|---:|---:|",
        f"| middleware around a trivial view, one matching policy | {o['middleware_outside']:.1f} | {o['middleware_cpu']:.1f} | {o['middleware_p50']:.1f} |",
        f"| the trivial view alone | {o['view_outside']:.1f} | {o['view_cpu']:.1f} | {o['view_p50']:.1f} |",
        f"| DRF PolicyThrottle.allow_request | {o['throttle_outside']:.1f} | {o['throttle_cpu']:.1f} | {o['throttle_p50']:.1f} |",
        f"| raw EVALSHA of the same script, keys and arguments through redis-py | {o['raw_outside']:.1f} | {o['raw_cpu']:.1f} | {o['raw_p50']:.1f} |",
        "",
        f"Overhead outside the round trip: middleware **{o['middleware_overhead']:.1f} us** (minus the view's own), "
        f"DRF throttle **{o['throttle_overhead']:.1f} us**. By user CPU (path - view - raw): middleware "
        f"{o['middleware_cpu_overhead']:.1f} us, throttle {o['throttle_cpu_overhead']:.1f} us.",
    ]
    if results.e2e:
        base = results.e2e.get("middleware off")
        lines += ["", "## End to end (gunicorn, 2 workers; wrk -t2 -c4, 5 s; /demo/search/)", "",
                  "| configuration | requests/s | ratio to middleware off |", "|---|---:|---:|"]
        lines += [f"| {name} | {rate:,.0f} | {rate / base:.2f} |" for name, rate in results.e2e.items()]
    lines += ["", "## Budgets (DESIGN.md)", "", "| budget | measured | verdict |", "|---|---|---|"]
    lines += [f"| {b} | {m} | {v} |" for b, m, v in budgets(results)]
    if results.notes:
        lines += ["", "Notes:", *[f"- {note}" for note in results.notes]]
    return "\n".join(lines) + "\n"


def budgets(results: Results):
    ping = results.floors["ping_p50"]
    ours = [row for row in results.rows if row[0].startswith("ratelimit_app")]
    trips = max(row[3] for row in ours)
    yield "round trips per limited request: 1.00, any number of policies", f"{trips:.2f} (max over rows)", _verdict(trips == 1)
    worst = max(row[1] / ping for row in ours if "1 policy" in row[0])
    yield "decision p50 within 1.15 x PING (1 policy)", f"{worst:.2f} x PING (worst strategy)", _verdict(worst <= 1.15)
    for name, key in (("middleware", "middleware_overhead"), ("DRF throttle", "throttle_overhead")):
        value = results.overhead[key]
        yield f"Python overhead per request < 30 us ({name})", f"{value:.1f} us", _verdict(value < 30)
    exact = [row[7] for row in ours if row[7] is not None]
    yield "exactness: 8 x 100 against 100 admit exactly 100, every strategy", ", ".join(map(str, exact)), _verdict(all(e == 100 for e in exact))
    fixed = next(size for s, _, size, _ in results.memory if s == "fixed_window")
    yield "fixed_window memory per subject < 100 bytes", f"{fixed} bytes", _verdict(fixed < 100)
    ours_rate = min(row[6] for row in ours if "1 policy" in row[0])
    for row in results.rows:
        if row[0].startswith(("DRF", "django-ratelimit")):
            ratio = ours_rate / row[6]
            yield f"decisions/s >= 2 x {row[0]}", f"{ratio:.2f} x (slowest strategy of ours)", _verdict(ratio >= 2)
