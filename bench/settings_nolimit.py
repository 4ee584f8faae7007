"""The demo site without any rate limiting, for the end-to-end baseline."""

from project.settings import *  # noqa: F401,F403
from project.settings import MIDDLEWARE, REST_FRAMEWORK

MIDDLEWARE = [m for m in MIDDLEWARE if "ratelimit" not in m]
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": []}
