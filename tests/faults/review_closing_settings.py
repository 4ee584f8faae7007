"""The demo site serving tests.faults.review_closing_site (hit()'s places given back as a request ends)."""

import os

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.faults.review_closing_site"
RATELIMIT_FAIL_OPEN = True
if os.environ.get("FAULTS_WITHOUT_MIDDLEWARE"):  # hit() alone counts: its places go back as the request ends
    MIDDLEWARE = [m for m in MIDDLEWARE if m != "ratelimit_app.middleware.RateLimitMiddleware"]  # noqa: F405
