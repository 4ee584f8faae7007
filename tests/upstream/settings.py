"""Settings for the upstream test files: the demo's, plus the caches django-ratelimit's tests name."""

from __future__ import annotations

from project.settings import *  # noqa: F403

CLOSED_PORT = "redis://127.0.0.1:1/0"  # nothing listens there: every command fails at once
_unreachable = {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": CLOSED_PORT,
    "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.1, "SOCKET_TIMEOUT": 0.1},
}
CACHES = {
    **CACHES,  # noqa: F405
    "connection-errors": _unreachable,
    "connection-errors-redis": {**_unreachable, "OPTIONS": {**_unreachable["OPTIONS"], "IGNORE_EXCEPTIONS": True}},
    "instant-expiration": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
}
REST_FRAMEWORK = {}  # DRF's defaults, as its own test settings have
MIDDLEWARE = [m for m in MIDDLEWARE if "ratelimit_app" not in m]  # noqa: F405  (the files call views directly)
