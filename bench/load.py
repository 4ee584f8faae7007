"""python -m bench.load PORT PATH SECONDS LIMIT: one process of the Python load generator (bench/e2e.py
runs several when wrk is missing): one GET per connection until SECONDS pass or LIMIT requests are
made; prints "<requests> <answers other than 2xx or failed>". Standard library only: it starts fast."""

from __future__ import annotations

import http.client
import sys
import time


def main(port: int, path: str, seconds: float, limit: int) -> tuple[int, int]:
    done = failed = 0
    deadline = time.perf_counter() + seconds
    while done < limit and time.perf_counter() < deadline:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            response.read()
            failed += not 200 <= response.status < 300
        except OSError:
            failed += 1
        finally:
            connection.close()
        done += 1
    return done, failed


if __name__ == "__main__":
    port, path, seconds, limit = sys.argv[1:]
    print(*main(int(port), path, float(seconds), int(limit)))
