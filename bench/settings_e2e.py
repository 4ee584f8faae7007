"""The site served in the end-to-end run: the demo's settings with the bench's trivial views, DEBUG
off, and RateLimitMiddleware only when BENCH_MIDDLEWARE=1."""

import os

from project.settings import *  # noqa: F401,F403
from project.settings import MIDDLEWARE, REST_FRAMEWORK

DEBUG = False
ROOT_URLCONF = "bench.site"
if os.environ.get("BENCH_MIDDLEWARE") != "1":
    MIDDLEWARE = [m for m in MIDDLEWARE if "ratelimit" not in m]
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_CLASSES": [],  # each DRF view below names its own
    "DEFAULT_THROTTLE_RATES": {"user": "1000000000/hour", "anon": "1000000000/hour"},
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
