"""The demo site serving tests.faults.review_closing_site (hit()'s places given back when Django closes the request)."""

import os

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.faults.review_closing_site"
RATELIMIT_FAIL_OPEN = True
MIDDLEWARE = ["django.middleware.http.ConditionalGetMiddleware", *MIDDLEWARE]  # noqa: F405
if os.environ.get("FAULTS_WITHOUT_MIDDLEWARE"):  # hit() alone counts: Django's close of the request gives back
    MIDDLEWARE = [m for m in MIDDLEWARE if m != "ratelimit_app.middleware.RateLimitMiddleware"]
