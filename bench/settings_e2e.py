"""The site served in the end-to-end run: the demo's settings with the bench's trivial views, DEBUG
off, and RateLimitMiddleware only when BENCH_MIDDLEWARE=1."""

import os

from project.settings import *  # noqa: F401,F403
from project.settings import MIDDLEWARE, REDIS_URL, REST_FRAMEWORK


def smart_ratelimit_redis(url: str) -> dict:
    """django-smart-ratelimit's RATELIMIT_REDIS for `url`, as host, port and db: given a url, its async
    backend (4.12.1) passes it to from_url twice, fails, and lets every request through unasked."""
    from redis.connection import parse_url

    return {name: value for name, value in parse_url(url).items() if name in ("host", "port", "db", "password", "username")}


DEBUG = False
ROOT_URLCONF = "bench.site"
if os.environ.get("BENCH_SERVER") == "uvicorn":
    # Django runs a MiddlewareMixin's hooks (sessions, CSRF, auth, messages...) in a thread started for
    # each request under ASGI: about 2 ms of CPU a request here, which hid every limiter's cost
    MIDDLEWARE = [m for m in MIDDLEWARE if "ratelimit" in m]
if os.environ.get("BENCH_MIDDLEWARE") != "1":
    MIDDLEWARE = [m for m in MIDDLEWARE if "ratelimit" not in m]
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_CLASSES": [],  # each DRF view below names its own
    "DEFAULT_THROTTLE_RATES": {"user": "1000000000/hour", "anon": "1000000000/hour"},
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
# django-smart-ratelimit (a peer): its Redis backend on the same server, fixed windows. Its other
# RATELIMIT_* settings share our names; RATELIMIT_KEY_PREFIX ("rl") prefixes its keys too.
RATELIMIT_BACKEND = "redis"
RATELIMIT_REDIS = smart_ratelimit_redis(REDIS_URL)
RATELIMIT_ALGORITHM = "fixed_window"
