"""One freshly started process of the site: Django set up, nothing requested yet. It says "ready",
waits for a line on stdin, then makes `count` GET requests to `path` through Django's WSGI handler
(the test client: request_started, every middleware, the URLconf imported on the first request) and
prints the status codes it got, as JSON."""

from __future__ import annotations

import json
import os
import sys


def main(path: str, count: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.faults.code_settings")
    import django

    django.setup()
    from django.test import Client

    client = Client()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    statuses = [client.get(path).status_code for _ in range(count)]
    print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
