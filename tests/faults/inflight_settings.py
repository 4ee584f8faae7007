"""The demo site serving tests.faults.inflight_site: ConditionalGetMiddleware first, as Django documents
it, and a middleware inside RateLimitMiddleware that fails on the way out of some paths."""

import os

from project.settings import *  # noqa: F403

WSGI_APPLICATION = os.environ.get("FAULTS_WSGI_APPLICATION", WSGI_APPLICATION)  # noqa: F405
# a test may let a decision wait longer than the demo's timeout (a client leaving while it waits)
CACHES["default"]["OPTIONS"]["SOCKET_TIMEOUT"] = float(os.environ.get("FAULTS_SOCKET_TIMEOUT", "0.25"))  # noqa: F405

ROOT_URLCONF = "tests.faults.inflight_site"
MIDDLEWARE = [
    "django.middleware.http.ConditionalGetMiddleware",
    *MIDDLEWARE,  # noqa: F405
    "tests.faults.inflight_site.FailingOnTheWayOut",
]
