"""The demo site serving tests.faults.review_boundary_site (the boundary attacked on real servers)."""

import os

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.faults.review_boundary_site"
RATELIMIT_FAIL_OPEN = os.environ.get("FAULTS_FAIL_OPEN", "1") == "1"
