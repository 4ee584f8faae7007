"""Prometheus metrics of rate limiting, and a view that exposes them (prometheus_client is optional:
without it, or with RATELIMIT_METRICS = False, every hook returns at its first line)."""

from __future__ import annotations

import os
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

if prometheus_client is not None:
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

_children: dict[tuple[str, str], Any] = {}  # labels() costs a lock and a tuple per call: look each child up once
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


def _child(metric: Any, *labels: str) -> Any:
    child = _children.get((metric, *labels))
    if child is None:
        child = _children[(metric, *labels)] = metric.labels(*labels)
    return child


# --- hooks on the request path ----------------------------------------------------------------


def record_verdict(verdict: Verdict) -> None:
    """Count each policy's outcome for one decided request (never for a dry run).

    A policy that admitted a request which another policy denied counted nothing, and is not
    counted here either: allowed and denied add up to the live page's totals of each window.
    """
    if not _on:
        return
    for decision in verdict.decisions:
        if decision.exceeded:
            outcome = "shadow_denied" if decision.allowed else "denied"
        elif verdict.allowed:
            outcome = "allowed"
        else:
            continue
        _child(DECISIONS, decision.policy.name, outcome).inc()


def record_exempt(policy: CompiledPolicy) -> None:
    """A request of a subject that an override or a plan exempts from `policy` (Redis was not asked for it)."""
    if _on:
        _child(DECISIONS, policy.name, "exempt").inc()


def record_call(seconds: float) -> None:
    """How long the request path's Redis call took (the decide script, its round trip included)."""
    if _on:
        REDIS_CALL.observe(seconds)


def record_outage(allowed: bool) -> None:
    """A request decided without Redis: let through (fail open) or refused (fail closed)."""
    if _on:
        _child(OUTAGE_REQUESTS, "allowed" if allowed else "refused").inc()


def deny_cache_hit(policy: CompiledPolicy) -> None:
    """A request denied by the local deny cache under `policy`, without a Redis call."""
    if _on:
        _child(DENY_CACHE_HITS, policy.name).inc()


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
