"""The demo site serving tests.faults.review_metering2_site: downloads counted by a content-bytes policy."""

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.faults.review_metering2_site"
