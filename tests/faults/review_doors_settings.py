"""The demo site serving tests.faults.review_doors_site (the doors attacked on real servers)."""

import os

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.faults.review_doors_site"
RATELIMIT_FAIL_OPEN = os.environ.get("FAULTS_FAIL_OPEN", "1") == "1"
if os.environ.get("FAULTS_WITHOUT_MIDDLEWARE"):  # hit() alone counts, and request_finished gives back
    MIDDLEWARE = [m for m in MIDDLEWARE if m != "ratelimit_app.middleware.RateLimitMiddleware"]  # noqa: F405
