"""Prometheus metrics of rate limiting, and a view that exposes them (prometheus_client is optional:
without it, or with RATELIMIT_METRICS = False, every hook returns at its first line).

The request path only appends its records to lists (prometheus_client's inc and observe cost ~9k
instructions each, 5% of a request); fold() adds them to the metrics before any collection of the
registry, after each flush of the engine's tally, within FOLD_SECONDS otherwise, and at exit.
"""

from __future__ import annotations

import atexit
import os
import threading
from bisect import bisect_right
from collections import Counter
from functools import reduce
from math import inf
from operator import add
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse

from .conf import get_setting
from . import engine
from .lru import BoundedCache, byte_bounded_cache, size_of

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
    """Registered ahead of the metrics: whatever collects the registry folds the records first."""

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
    FAULTS = prometheus_client.Counter(
        "ratelimit_faults",
        "Errors of the limiter's own (the database, a setting, a bug) that the boundary kept from the site, "
        "by kind; each request concerned followed RATELIMIT_FAIL_OPEN.",
        ["kind"],
    )
    DENY_CACHE_HITS = prometheus_client.Counter(
        "ratelimit_deny_cache_hits",
        "Requests denied from the local deny cache, without asking Redis, per policy.",
        ["policy"],
    )

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


@byte_bounded_cache(entry_bytes=1024)  # labels() costs a lock and a tuple per call: look each child up once
def _child(key: tuple) -> Any:  # key: (metric, *labels), labels a policy's name and an outcome
    return key[0].labels(*key[1:])


# --- the request path's records, folded into the metrics --------------------------------------
# Each hook appends to a list (one C call, atomic under the GIL: a lock's acquire and release cost
# four times as much); fold() pops what was there and adds it up. Histograms have no public batched
# observe: fold adds each bucket's count and the sum to the histogram's values (`_buckets[i].inc(n)`,
# `_sum.inc(s)`, as observe() does in prometheus_client 0.26; a collector of our own would not reach
# multiprocess mode's files). test_metrics_folding fails if they change; without them fold observes.


def _batchable(histogram: Any) -> bool:
    """Whether fold can add to `histogram`'s buckets and sum (prometheus_client's internals as of 0.26)."""
    buckets = getattr(histogram, "_buckets", None)  # one per upper bound
    return getattr(histogram, "_upper_bounds", None) == list(UPPER_BOUNDS) and isinstance(buckets, list) and all(
        hasattr(value, "inc") for value in (*buckets, getattr(histogram, "_sum", None)))


def _records() -> None:
    global _keys, _seconds, _key, _call
    _keys, _seconds = [], []  # (metric, *labels), call durations
    _key, _call = _keys.append, _seconds.append


def _outcomes_size(policy: CompiledPolicy, kept: tuple) -> int:
    return size_of(kept, *kept) + OUTCOMES * size_of(policy.name)


OUTCOMES = 3  # a policy's outcomes decided by Redis: allowed, denied, shadow_denied
# A policy's outcome keys, made once: a record keeps no new object alive until the fold (that fed the
# garbage collector: a Verdict kept per request made 2.6 collections a 1,000 requests rather than 0.1).
# By policy (a snapshot is itself, hashed by identity), read with the dict's own get on every decision
outcomes = BoundedCache("ratelimit_app.metrics.outcomes", _outcomes_size)
_outcomes_of = outcomes.get


def _outcomes(policy: CompiledPolicy) -> tuple[tuple, tuple, tuple]:
    """The policy's (allowed, denied, shadow_denied) keys, made and kept at its first decision here."""
    kinds = ("allowed", "denied", "shadow_denied")
    return outcomes.put(policy, tuple((DECISIONS, policy.name, kind) for kind in kinds))


_records()
_lock = threading.Lock()  # arms the fold's timer once
_folding = threading.Lock()  # a fold waits for the one under way: a collection after it sees every record
_folder: threading.Timer | None = None  # the fold due FOLD_SECONDS after a request, once armed
_batched = prometheus_client is not None and _batchable(REDIS_CALL)


def _arm() -> None:
    # a thread of its own: the tally's flush runs only while Redis is asked (not for outages, exemptions)
    global _folder
    with _lock:
        if _folder is None:
            _folder = threading.Timer(FOLD_SECONDS, _fold_when_due)
            _folder.daemon = True
            _folder.start()


def _fold_when_due() -> None:
    global _folder
    with _lock:
        _folder = None  # a record appended from now on arms the next one (it is in this fold or that one)
    fold()


def fold() -> None:
    """Add what the request path recorded to the prometheus_client metrics (and under gunicorn's
    multiprocess mode to this worker's files): everything recorded before the call."""
    with _folding:  # each list's head is taken (appended meanwhile: the next fold's)
        # taken and counted in C: a loop of Python per record cost every request a few thousand instructions
        counts = Counter(_taken(_keys))
        for key, amount in counts.items():
            _child(key).inc(amount)
        if _seconds:
            fold_calls(REDIS_CALL, _taken(_seconds))


def _taken(records: list) -> list:
    """The records in `records` now, taken out: a request's append (a step in C) goes after them, not lost."""
    head = records[:len(records)]
    del records[:len(head)]
    return head


def fold_calls(histogram: Any, seconds: list[float]) -> None:
    """Add these calls' `seconds` to `histogram`, as observing each would."""
    if not _batched:
        for each in seconds:
            histogram.observe(each)
        return
    # each in the first bucket whose bound is >= it: prometheus' `le`; the sum added in order, as observe adds
    # (sum() of Python 3.12 rounds otherwise): reduce's additions are those of a loop, run in C
    total = reduce(add, seconds, 0.0)
    histogram._sum.inc(total)
    ordered, below = sorted(seconds), 0  # sorted in C: each bucket's count is where its bound falls
    for bucket, bound in enumerate(UPPER_BOUNDS):
        upto = bisect_right(ordered, bound, below)  # the calls of at most `bound` seconds
        if upto > below:
            histogram._buckets[bucket].inc(upto - below)
            below = upto


def _forked() -> None:
    # a forked child (a gunicorn worker) has no fold timer, and must not fold its parent's records again
    global _lock, _folding, _folder
    _records()
    _lock, _folding, _folder = threading.Lock(), threading.Lock(), None


# --- hooks on the request path ----------------------------------------------------------------


def record_verdict(verdict: Verdict) -> None:
    """Count each policy's outcome for one decided request (never for a dry run). A policy that admitted a
    request another denied counted nothing, nor here: allowed and denied add up to the live page's totals."""
    if _on:
        admitted = verdict.allowed
        for decision in verdict.decisions:
            allowed, denied, shadow_denied = _outcomes_of(decision.policy) or _outcomes(decision.policy)
            if decision.exceeded:
                _key(shadow_denied if decision.allowed else denied)
            elif admitted:
                _key(allowed)
        if _folder is None:
            _arm()


def record_exempt(policy: CompiledPolicy) -> None:
    """A request of a subject that an override or a plan exempts from `policy` (Redis was not asked for it)."""
    if _on:
        _key((DECISIONS, policy.name, "exempt"))
        if _folder is None:
            _arm()


def record_call(seconds: float) -> None:
    """How long the request path's Redis call took (the decide script, its round trip included)."""
    if _on:
        _call(seconds)
        if _folder is None:
            _arm()


def record_outage(allowed: bool) -> None:
    """A request decided without Redis: let through (fail open) or refused (fail closed)."""
    if _on:
        _key((OUTAGE_REQUESTS, "allowed" if allowed else "refused"))
        if _folder is None:
            _arm()


def record_fault(kind: str) -> None:
    """An error of the limiter's own, of `kind` (the exception's class), kept from the site."""
    if _on:
        _key((FAULTS, kind))
        if _folder is None:
            _arm()


def deny_cache_hit(policy: CompiledPolicy) -> None:
    """A request denied by the local deny cache under `policy`, without a Redis call."""
    if _on:
        _key((DENY_CACHE_HITS, policy.name))
        if _folder is None:
            _arm()


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
engine.hooks.decided = record_call  # the engine times its calls and reports here (it imports nothing above it)
engine.hooks.flushed = fold  # the tally's background flush, while Redis is asked: its thread folds too
atexit.register(fold)
os.register_at_fork(after_in_child=_forked)
