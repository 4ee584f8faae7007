"""A worker's memory is bounded in bytes, whatever the number of policies: 100 policies deciding 2,048
new clients each add at most 32 MB to the process (its caches keep RATELIMIT_CACHE_BYTES at most)."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from ratelimit_app import engine, lru
from ratelimit_app.engine import arguments, decision_connection, keys
from ratelimit_app.engine.tally import tally
from tests.helpers import check, policy

ROOT = Path(__file__).resolve().parent.parent
# 2,048 subjects x 100 policies (half the 4,096 of the docs' figure, half the CPU): bounded, the process grew by
# 16.7 MB; with the packed commands' cache unbounded alone by 45.1 MB, the scripts' arguments' alone 105.7 MB,
# both 138.6 MB. 32 MB (RATELIMIT_CACHE_BYTES' default) lies between: each of those fails, as 50 MB did at 4,096.
SUBJECTS = 2048
MOST_GROWTH = 32 * 2**20


@pytest.mark.slow
def test_a_hundred_policies_over_2048_subjects_grow_a_worker_by_32_mb_at_most(private):
    # a process of its own, so that its RSS is the workload's; fixed windows, through the middleware
    done = subprocess.run(
        [sys.executable, "-m", "bench.cache_memory", "100", str(SUBJECTS)], cwd=ROOT,
        env={**os.environ, "REDIS_URL": private.url}, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    growth = int(re.search(r"^growth_bytes=(-?\d+)$", done.stdout, re.MULTILINE).group(1))
    assert growth <= MOST_GROWTH, done.stdout


def _held_by_python(work) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.django_db
def test_what_decisions_keep_stays_within_the_cache_bytes_whatever_the_number_of_policies(settings):
    settings.RATELIMIT_CACHE_BYTES = 2 * 2**20
    policies = [policy(limit=10**6, window=3600) for _ in range(50)]
    engine.decide([check(each, "ip:192.0.2.1") for each in policies])  # the scripts loaded, the imports done

    def decide_many() -> None:
        for i in range(200):  # 10,000 policy-subjects, about 850 bytes each (8 MB) before they were bounded
            engine.decide([check(each, f"ip:2001:db8:{i:x}::") for each in policies])
        tally.flush()

    held = _held_by_python(decide_many)
    assert held <= 2 * 2**20 + 2**20, f"{held / 2**20:.1f} MB kept"  # + 1 MB: what is not a cache (metrics ...)
    for name, cache in lru.caches().items():
        assert cache.held() <= cache.budget(), name


def _key(c) -> tuple:
    return c.policy, c.subject, c.limit, "", keys.prefix(), keys.shards()


@pytest.mark.django_db
def test_a_subject_decided_again_finds_its_arguments_and_its_command_kept():
    policies = [policy(limit=10**6, window=3600) for _ in range(100)]
    checks = [check(each, "ip:192.0.2.7") for each in policies]
    engine.decide(checks)
    kept = [arguments.script_parts.get(_key(c)) for c in checks]
    built, packed = len(arguments.script_parts), len(decision_connection.packed)
    assert all(parts is not None for parts in kept)
    assert [decision.count for decision in engine.decide(checks).decisions] == [2] * 100
    again = [arguments.script_parts.get(_key(c)) for c in checks]
    assert all(a is b for a, b in zip(again, kept))  # nothing built again, nor packed again
    assert (len(arguments.script_parts), len(decision_connection.packed)) == (built, packed)
