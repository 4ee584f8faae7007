"""Soak: the demo under gunicorn (2 workers) and 4 concurrent clients for about 30 seconds, on one
subject and on many: never more 200s in a window than the limit, no 5xx, Redis memory that drains."""

from __future__ import annotations

import collections
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.servers import Server, manage, site_env

pytestmark = pytest.mark.slow
LIMIT, WINDOW = 25, 3  # fixed windows of 3 s: about five windows per phase
PHASE_SECONDS = 14
CLIENTS = 4


def hammer(url: str, stop: float, addresses: list[str], log: list, lock: threading.Lock) -> None:
    i = 0
    while time.time() < stop:
        address = addresses[i % len(addresses)]
        i += 1
        request = urllib.request.Request(url, headers={"X-Forwarded-For": address})
        sent = time.time()
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except OSError:
            status = -1  # connection-level failure
        with lock:
            log.append((address, sent, time.time(), status))


def run_phase(url: str, addresses: list[str]) -> list:
    log: list = []
    lock = threading.Lock()
    stop = time.time() + PHASE_SECONDS
    threads = [threading.Thread(target=hammer, args=(url, stop, addresses, log, lock)) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return log


def over_admissions(log: list) -> tuple[int, int]:
    """(worst excess over the limit in any window and subject, responses whose window is certain).

    A 200 counts in window w only when the request was sent and answered inside w (the decision was
    made in between); the few that straddle a boundary are left out rather than guessed."""
    per_window: collections.Counter = collections.Counter()
    certain = 0
    for address, sent, answered, status in log:
        if status == 200 and int(sent // WINDOW) == int(answered // WINDOW):
            per_window[(address, int(sent // WINDOW))] += 1
            certain += 1
    return max([count - LIMIT for count in per_window.values()] + [0]), certain


@pytest.fixture
def site(tmp_path):
    env = site_env(tmp_path / "soak.sqlite3", RATELIMIT_TRUSTED_PROXIES="127.0.0.1")
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", (
        "from ratelimit_app.models import Policy\n"
        f"Policy.objects.create(name='soak', action='demo:search', limit={LIMIT}, window={WINDOW}, "
        "strategy='fixed_window', key='ip')"
    ))
    server = Server(env, workers=2)
    try:
        yield server
    finally:
        server.stop()


def test_soak_never_over_admits_and_never_fails(site, redis_client):
    url = site.url + "/demo/search/?q=a"
    one = run_phase(url, ["198.51.100.7"])
    many = run_phase(url, [f"198.51.100.{i}" for i in range(1, 41)])
    figures = {}
    for name, log in (("one subject", one), ("40 subjects", many)):
        statuses = collections.Counter(status for *_, status in log)
        excess, certain = over_admissions(log)
        figures[name] = (len(log), statuses[200], statuses[429], excess, sum(n for s, n in statuses.items() if s >= 500 or s < 0))
        assert excess == 0, f"{name}: {excess} requests over the limit in one window"
        assert statuses[200] and statuses[429], f"{name}: the limit was never reached ({statuses})"
        assert set(statuses) <= {200, 429}, f"{name}: unexpected statuses {statuses}"
        assert certain > 0.7 * statuses[200]  # admissions cluster right after each boundary

    # every counter and index expires by itself, a few windows after its last request: each carries
    # an expiry that short (the version token stays; a policy's totals keep the last hour's trend)
    # (nor the word that a worker runs its Functions library, which lives a minute after its last refresh, nor
    # what the workers said of their policies, two minutes)
    lasting = {key: redis_client.pttl(key) for key in redis_client.keys("*")
               if b":totals:" not in key and not key.endswith(b":version") and b":library:ratelimit_" not in key
               and not key.endswith(b":workers")}
    assert 0 < redis_client.pttl("rl:workers") <= 120_000
    memory = redis_client.info("memory")["used_memory"]
    for name, (tried, ok, denied, excess, failures) in figures.items():
        print(f"\nsoak {name}: {tried} requests, {ok} x 200, {denied} x 429, over-admissions {excess}, 5xx {failures}")
    print(f"keys right after: {redis_client.dbsize()}, used_memory {memory} bytes, expiries (ms) {sorted(set(lasting.values()))[-5:]}")
    # (the live index lasts 3 x (window + totals bucket) past its last write: at most 6 windows)
    # (-1: no expiry; 0 or -2: expiring, or gone, as it is read)
    assert {key: ms for key, ms in lasting.items() if ms == -1 or ms > (6 * WINDOW + 5) * 1000} == {}
    totals = [key for key in redis_client.keys("*") if b":totals:" in key]
    assert all(0 < redis_client.ttl(key) <= 3600 for key in totals)  # and the totals will
