"""The demo site with the fault suite's URLconf of policies declared in code (fresh workers, fresh
databases); DATABASE_URL and REDIS_URL come from the environment as for the demo."""

import json
import os

from project.settings import *  # noqa: F403

# extra policies a scenario declares in settings (JSON), beside the URLconf's
RATELIMIT_POLICIES = json.loads(os.environ.get("FAULT_POLICIES", "[]"))

ROOT_URLCONF = "tests.faults.code_urls"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"ratelimit_app": {"handlers": ["console"], "level": "WARNING"}},
}
