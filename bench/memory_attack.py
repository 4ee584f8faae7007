"""python -m bench.memory_attack [COUNT] [MEGABYTES]: memory a process keeps after COUNT login posts
with distinct usernames of MEGABYTES each, under a `param:username` policy (needs REDIS_URL).

Prints the memory Python still holds afterwards (tracemalloc), and the resident set size before,
after, and after a garbage collection, in MB (RSS also shows what the allocator keeps for reuse).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import tracemalloc


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def main(count: int, megabytes: float) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.test import Client
    from django.test.utils import setup_databases, setup_test_environment

    settings.CACHES["default"]["LOCATION"] = os.environ["REDIS_URL"]
    setup_test_environment()
    setup_databases(verbosity=0, interactive=False)  # an in-memory SQLite database
    logging.getLogger("django.request").setLevel(logging.ERROR)  # 401s are the point here

    from ratelimit_app.models import Policy

    Policy.objects.create(name="login-per-username", action="login", limit=10**6, window=300, key="param:username")
    client = Client()
    size = int(megabytes * (1 << 20))
    client.post("/demo/login/", "username=warm", content_type="application/x-www-form-urlencoded")
    gc.collect()
    tracemalloc.start()
    held_before = tracemalloc.get_traced_memory()[0]
    before = rss_mb()
    for i in range(count):
        body = f"username={i:06d}" + "u" * size
        status = client.post("/demo/login/", body, content_type="application/x-www-form-urlencoded").status_code
        assert status == 401, status
    after = rss_mb()
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - held_before) / (1 << 20)
    print(f"{count} posts x {megabytes} MB usernames: Python holds {held:.1f} MB more afterwards; "
          f"RSS {before:.0f} MB before, {after:.0f} MB after, {rss_mb():.0f} MB after gc.collect()")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400, float(sys.argv[2]) if len(sys.argv) > 2 else 2)
