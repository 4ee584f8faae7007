"""Prometheus metrics of rate limiting, and a view that exposes them (prometheus_client is optional:
without it, or with RATELIMIT_METRICS = False, every hook returns at its first line).

The request path only adds to plain tallies (prometheus_client's inc and observe cost ~9k instructions
each, 5% of a request); fold() adds them to the metrics before any collection of the registry, after
each flush of the engine's tally, within FOLD_SECONDS otherwise, and at exit.
"""

from __future__ import annotations

import atexit
import os
import threading
from bisect import bisect_left
from math import inf
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse

from .conf import get_setting
from .engine import hooks

try:
    import prometheus_client
    from prometheus_client import multiprocess
except ImportError:  # the optional extra is not installed: metrics stay off
    prometheus_client = None

if TYPE_CHECKING:
    from .values import CompiledPolicy, Verdict

# Seconds; a decision on a healthy local Redis takes ~0.1-0.5 ms, a socket timeout 0.25 s.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
UPPER_BOUNDS = (*LATENCY_BUCKETS, inf)  # the histogram's buckets: prometheus_client closes them with +Inf
# Under gunicorn's multiprocess mode the other workers' counts show this much later at most (in its
# files); while Redis is asked the tally's flush folds sooner (FLUSH_SECONDS).
FOLD_SECONDS = 1.0


class _FoldFirst:
    """Registered ahead of the metrics: whatever collects the registry folds the tallies first."""

    def describe(self) -> list:
        return []  # no metric of its own (and collect() is not run at registration)

    def collect(self) -> list:
        fold()
        return []


if prometheus_client is not None:
    prometheus_client.REGISTRY.register(_FoldFirst())  # the registry collects in the order of registration
    DECISIONS = prometheus_client.Counter(
        "ratelimit_decisions",
        "Requests decided, per policy and outcome: allowed (counted), denied, shadow_denied (a shadow "
        "policy would have denied), exempt (an override or a plan exempts the subject).",
        ["policy", "outcome"],
    )
    REDIS_CALL = prometheus_client.Histogram(
        "ratelimit_redis_call_duration_seconds",
        "Time of the request path's Redis call, from sending the script to its answer.",
        buckets=LATENCY_BUCKETS,
    )
    BREAKER_OPEN = prometheus_client.Gauge(
        "ratelimit_breaker_open",
        "1 while the circuit breaker keeps requests away from Redis after an error (any worker).",
        multiprocess_mode="livemax",
    )
    BREAKER_OPENINGS = prometheus_client.Counter(
        "ratelimit_breaker_openings", "Times the circuit breaker opened after a Redis error."
    )
    OUTAGE_REQUESTS = prometheus_client.Counter(
        "ratelimit_outage_requests",
        "Requests decided without Redis (down or circuit open), by outcome: allowed (RATELIMIT_FAIL_OPEN) or refused.",
        ["outcome"],
    )
    DENY_CACHE_HITS = prometheus_client.Counter(
        "ratelimit_deny_cache_hits",
        "Requests denied from the local deny cache, without asking Redis, per policy.",
        ["policy"],
    )

_children: dict[tuple, Any] = {}  # labels() costs a lock and a tuple per call: look each child up once
_on = False


def _switched_on() -> bool:
    wanted = get_setting("RATELIMIT_METRICS")
    return prometheus_client is not None and wanted is not False


def enabled() -> bool:
    """Whether the hooks record anything (prometheus_client installed and RATELIMIT_METRICS not False)."""
    return _on


def forget_settings() -> None:
    global _on
    _on = _switched_on()


def _child(key: tuple) -> Any:  # key: (metric, *labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = key[0].labels(*key[1:])
    return child


# --- tallies of the request path, folded into the metrics -------------------------------------
# Histograms have no public batched observe. Folding adds each bucket's count to the histogram's
# bucket values and the seconds to its sum (`_buckets[i].inc(n)`, `_sum.inc(s)`: what observe() does in
# prometheus_client 0.26), rather than a collector of our own, which multiprocess mode's files would not
# see; test_metrics_folding fails if the internals change, and without them the request path observes.


def _batchable(histogram: Any) -> bool:
    """Whether fold can add to `histogram`'s buckets and sum (prometheus_client's internals as of 0.26)."""
    buckets = getattr(histogram, "_buckets", None)  # one per upper bound
    return getattr(histogram, "_upper_bounds", None) == list(UPPER_BOUNDS) and isinstance(buckets, list) and all(
        hasattr(value, "inc") for value in (*buckets, getattr(histogram, "_sum", None)))


def _no_calls() -> list:
    return [0] * len(UPPER_BOUNDS) + [0.0]  # requests per bucket, then the sum of their seconds


_lock = threading.Lock()  # held by the request path for a few additions, by a fold to swap the tallies
_take, _give = _lock.acquire, _lock.release  # half the cost of `with _lock` (no special method lookups)
_folding = threading.Lock()  # a fold waits for the one under way: a collection after it sees every count
_counts: dict[tuple, int] = {}  # (metric, *labels) -> requests not folded yet
_calls = _no_calls()
_folder: threading.Timer | None = None  # the fold due FOLD_SECONDS after a request, once armed
_batched = prometheus_client is not None and _batchable(REDIS_CALL)


def _arm() -> None:
    # with _lock held; a thread of its own: the tally's flush runs only while Redis is asked (no outages)
    global _folder
    _folder = threading.Timer(FOLD_SECONDS, _fold_when_due)
    _folder.daemon = True
    _folder.start()


def _fold_when_due() -> None:
    global _folder
    with _lock:
        _folder = None  # a request from now on arms the next one (what it adds is in this fold or that one)
    fold()


def fold() -> None:
    """Add what the request path tallied to the prometheus_client metrics (and under gunicorn's
    multiprocess mode to this worker's files); anything recorded before it returns is included."""
    global _counts, _calls
    with _folding:
        with _lock:
            counts, calls = _counts, _calls
            if not counts and not any(calls):
                return
            _counts, _calls = {}, _no_calls()
        for key, amount in counts.items():
            _child(key).inc(amount)
        if any(calls):
            fold_calls(REDIS_CALL, calls)


def fold_calls(histogram: Any, calls: list) -> None:
    """Add the tallied `calls` (per bucket, then their sum) to `histogram`, as observing each would."""
    histogram._sum.inc(calls[-1])
    for bucket, amount in enumerate(calls[:-1]):
        if amount:
            histogram._buckets[bucket].inc(amount)


def _add(key: tuple) -> None:
    _take()
    try:
        _counts[key] = _counts.get(key, 0) + 1
        if _folder is None:
            _arm()
    finally:
        _give()


def _forked() -> None:
    # a forked child (a gunicorn worker) has no fold timer, and must not fold its parent's tallies again
    global _lock, _take, _give, _folding, _counts, _calls, _folder
    _lock, _folding, _counts, _calls, _folder = threading.Lock(), threading.Lock(), {}, _no_calls(), None
    _take, _give = _lock.acquire, _lock.release


# --- hooks on the request path ----------------------------------------------------------------


def record_verdict(verdict: Verdict) -> None:
    """Count each policy's outcome for one decided request (never for a dry run).

    A policy that admitted a request which another policy denied counted nothing, and is not
    counted here either: allowed and denied add up to the live page's totals of each window.
    """
    if not _on:
        return
    allowed = verdict.allowed
    _take()  # _add inlined: a call more costs a tenth of this function
    try:
        counts = _counts
        for decision in verdict.decisions:
            if decision.exceeded:
                key = (DECISIONS, decision.policy.name, "shadow_denied" if decision.allowed else "denied")
            elif allowed:
                key = (DECISIONS, decision.policy.name, "allowed")
            else:
                continue
            counts[key] = counts.get(key, 0) + 1
        if _folder is None:
            _arm()
    finally:
        _give()


def record_exempt(policy: CompiledPolicy) -> None:
    """A request of a subject that an override or a plan exempts from `policy` (Redis was not asked for it)."""
    if _on:
        _add((DECISIONS, policy.name, "exempt"))


def record_call(seconds: float) -> None:
    """How long the request path's Redis call took (the decide script, its round trip included)."""
    if not _on:
        return
    if not _batched:
        REDIS_CALL.observe(seconds)
        return
    bucket = bisect_left(UPPER_BOUNDS, seconds)  # the first bound >= seconds: prometheus' `le`
    _take()
    try:
        calls = _calls
        calls[bucket] += 1
        calls[-1] += seconds
        if _folder is None:
            _arm()
    finally:
        _give()


def record_outage(allowed: bool) -> None:
    """A request decided without Redis: let through (fail open) or refused (fail closed)."""
    if _on:
        _add((OUTAGE_REQUESTS, "allowed" if allowed else "refused"))


def deny_cache_hit(policy: CompiledPolicy) -> None:
    """A request denied by the local deny cache under `policy`, without a Redis call."""
    if _on:
        _add((DENY_CACHE_HITS, policy.name))


def breaker_opened() -> None:
    if _on:
        BREAKER_OPEN.set(1)
        BREAKER_OPENINGS.inc()


def breaker_closed() -> None:
    if _on:
        BREAKER_OPEN.set(0)


# --- exposition -------------------------------------------------------------------------------


def exposition() -> tuple[bytes, str]:
    """The metrics in Prometheus' text format and its content type (needs prometheus_client); under
    gunicorn's multiprocess mode (PROMETHEUS_MULTIPROC_DIR set) the sum over every worker, live or gone."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        fold()  # the collector reads the files: this worker's tallies go there first (the others' are folded)
        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = prometheus_client.REGISTRY
    return prometheus_client.generate_latest(registry), prometheus_client.CONTENT_TYPE_LATEST


def metrics_view(request: HttpRequest) -> HttpResponse:
    """`path("metrics", metrics_view)`: what Prometheus scrapes. Protect it as you would any page
    that tells how busy your site is (a private network, or a wrapping view that checks a token)."""
    if prometheus_client is None:
        return HttpResponse(
            "prometheus_client is not installed: pip install prometheus_client\n", status=501, content_type="text/plain"
        )
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)


_on = _switched_on()
hooks.decided = record_call  # the engine times its calls and reports here (it imports nothing above it)
hooks.flushed = fold  # the tally's background flush, while Redis is asked: its thread folds too
atexit.register(fold)
os.register_at_fork(after_in_child=_forked)
