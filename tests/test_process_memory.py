"""A worker's memory is bounded in bytes, whatever the number of policies: 100 policies deciding 4,096
new clients each add at most 50 MB to the process (its caches keep RATELIMIT_CACHE_BYTES at most)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
MOST_GROWTH = 50 * 2**20


@pytest.mark.slow
def test_a_hundred_policies_over_4096_subjects_grow_a_worker_by_50_mb_at_most(private):
    # a process of its own, so that its RSS is the workload's; fixed windows, through the middleware
    done = subprocess.run(
        [sys.executable, "-m", "bench.cache_memory", "100", "4096"], cwd=ROOT,
        env={**os.environ, "REDIS_URL": private.url}, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    growth = int(re.search(r"^growth_bytes=(-?\d+)$", done.stdout, re.MULTILINE).group(1))
    assert growth <= MOST_GROWTH, done.stdout
