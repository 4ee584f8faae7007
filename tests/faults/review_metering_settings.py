"""The demo site serving tests.metering_urls behind ConditionalGetMiddleware and GZipMiddleware (outside the
limiter's): what a content-bytes policy counts is what the server sent."""

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.metering_urls"
MIDDLEWARE = ["django.middleware.gzip.GZipMiddleware", "django.middleware.http.ConditionalGetMiddleware",
              *MIDDLEWARE]  # noqa: F405
