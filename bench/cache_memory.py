"""python -m bench.cache_memory [POLICIES] [SUBJECTS]: the memory one process keeps after deciding
SUBJECTS clients (IPv6 /64s) once each under POLICIES fixed-window policies, through the middleware
and the test client (needs REDIS_URL).

Prints one line: RSS after the warm-up and after the run, in MB, and their difference, then the
bytes each per-process cache holds (ratelimit_app.lru's accounting).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time

WARM_UP = 16  # subjects decided before the first measure: imports, the scripts loaded, the first arenas


def rss_bytes() -> int:
    """The resident set size now (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(policies: int, subjects: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.test import Client
    from django.test.utils import setup_databases, setup_test_environment

    settings.CACHES["default"]["LOCATION"] = os.environ["REDIS_URL"]
    # a busy machine's pause is no outage here: every request must be decided
    settings.CACHES["default"]["OPTIONS"].update(SOCKET_CONNECT_TIMEOUT=30, SOCKET_TIMEOUT=30)
    # the policies stay the ones compiled at the start however long the run takes (a reload compiles them
    # anew, and what was kept for the old ones may go with them: a figure that would depend on the speed)
    settings.RATELIMIT_POLICY_RELOAD_SECONDS = 3600
    setup_test_environment()
    setup_databases(verbosity=0, interactive=False)  # an in-memory SQLite database
    logging.getLogger("django.request").setLevel(logging.ERROR)

    from ratelimit_app import lru
    from ratelimit_app.models import Policy

    Policy.objects.bulk_create(
        Policy(name=f"memory-{i:03d}", action="*", limit=10**6, window=3600, strategy="fixed_window", key="ip")
        for i in range(policies)
    )
    client = Client()

    def decide(first: int, count: int) -> None:
        for i in range(first, first + count):
            address = f"2001:db8:{i >> 16:x}:{i & 0xFFFF:x}::1"  # one /64 each
            response = client.get("/demo/search/", REMOTE_ADDR=address)
            assert response.status_code == 200 and response.headers["RateLimit"].count(";r=") == policies, response

    decide(1 << 20, WARM_UP)
    gc.collect()
    before = rss_bytes()
    started = time.monotonic()
    decide(0, subjects)
    seconds = time.monotonic() - started
    gc.collect()
    after = rss_bytes()
    print(f"{policies} policies x {subjects} subjects: RSS {before / 2**20:.1f} MB after the warm-up, "
          f"{after / 2**20:.1f} MB after, growth {(after - before) / 2**20:.1f} MB "
          f"({seconds * 1000 / subjects:.2f} ms a request)")
    print(f"growth_bytes={after - before}")
    for name, held in sorted(lru.held().items()):
        print(f"cache {name}: {held / 2**20:.2f} MB")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100, int(sys.argv[2]) if len(sys.argv) > 2 else 4096)
