"""The demo site serving tests.faults.review_quotas_site (calendar quotas attacked on real servers)."""

import os

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.faults.review_quotas_site"
RATELIMIT_QUOTA_SAVE_SECONDS = float(os.environ.get("QUOTA_SAVE_SECONDS", "0.2"))
