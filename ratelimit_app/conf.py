"""Settings of ratelimit_app with their defaults, read at call time so override_settings works
(the values are cached until Django signals that a setting changed)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Master switch: False turns every door into a no-op (no Redis call at all).
    "RATELIMIT_ENABLED": True,
    # django-redis cache alias whose client the engine uses.
    "RATELIMIT_CACHE": "default",
    # Prefix of every Redis key, so several sites can share one server.
    "RATELIMIT_KEY_PREFIX": "rl",
    # Addresses or networks of proxies whose X-Forwarded-For is believed.
    "RATELIMIT_TRUSTED_PROXIES": (),
    "RATELIMIT_IPV4_PREFIX": 32,
    "RATELIMIT_IPV6_PREFIX": 64,
    # Header values are masked in the admin unless the header is listed here.
    "RATELIMIT_PLAIN_HEADERS": ("User-Agent", "Accept-Language", "Origin", "Referer", "Host"),
    # When Redis cannot be reached: True lets requests through, False answers 503.
    "RATELIMIT_FAIL_OPEN": True,
    # Seconds the circuit stays open after a Redis error before one request tries again.
    "RATELIMIT_BREAKER_SECONDS": 1.0,
    # Workers compare the policy version with Redis at most this often when no decision call carried it.
    "RATELIMIT_POLICY_RECHECK_SECONDS": 1.0,
    # A policy change also reaches every worker after at most this many seconds, whatever happened
    # to Redis (a safety net under the version check).
    "RATELIMIT_POLICY_RELOAD_SECONDS": 30.0,
    # Socket timeout of the admin's own Redis client (live page, policy list, resets); its errors
    # never open the circuit breaker that requests use.
    "RATELIMIT_ADMIN_TIMEOUT": 1.0,
    # How many recently active subjects the live page index keeps per policy.
    "RATELIMIT_LIVE_INDEX_SIZE": 2000,
    # Subjects are spread over this many shards, each one Redis Cluster slot with its own live index and
    # totals. 1 suits a single server (the operator's reads stay one per policy); on Redis Cluster use a
    # few times the number of masters (a system check warns about 1 there).
    "RATELIMIT_SHARDS": 1,
    # Seconds between two saves of calendar quotas' usage to the database (batched upserts): the most
    # usage a loss of Redis can take away.
    "RATELIMIT_QUOTA_SAVE_SECONDS": 5.0,
    # Dotted path of a view answering denied requests instead of the built-in 429 response.
    "RATELIMIT_DENIED_VIEW": None,
    # Refuse a subject over an enforcing limit from this process's memory until its retry time (no Redis call).
    "RATELIMIT_DENY_CACHE": True,
    # Prometheus metrics (ratelimit_app.metrics): None = on when prometheus_client is installed; False = off.
    "RATELIMIT_METRICS": None,
    # Policies declared in settings, e.g. [{"name": "api", "action": "/api/", "rate": "100/m", "key": "user_or_ip"}]:
    # written to the database as policies from code (see registry/).
    "RATELIMIT_POLICIES": (),
    # "auto": the scripts run as a Redis Functions library (FUNCTION LOAD once, then FCALL) where the
    # server has Functions (Redis >= 7, Valkey), EVALSHA elsewhere; False: always EVALSHA.
    "RATELIMIT_REDIS_FUNCTIONS": "auto",
    # Bytes a process keeps in its caches (script arguments, packed commands, subjects, refusals ...), all
    # of them together: each takes its share (ratelimit_app.lru.BUDGETS), the oldest entries going first.
    "RATELIMIT_CACHE_BYTES": 32 * 2**20,
}


# A setting read under another library's name when ours is not set: django-ratelimit's cache alias.
FALLBACKS = {"RATELIMIT_CACHE": "RATELIMIT_USE_CACHE"}

_cache: dict[str, Any] = {}


def get_setting(name: str) -> Any:
    """The setting's value or its default; cached, and forgotten whenever a setting changes."""
    try:
        return _cache[name]
    except KeyError:
        default = getattr(settings, FALLBACKS[name], DEFAULTS[name]) if name in FALLBACKS else DEFAULTS[name]
        value = _cache[name] = getattr(settings, name, default)
        return value


def forget_settings() -> None:
    _cache.clear()
