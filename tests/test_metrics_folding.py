"""The request path appends its metrics' records to deques that metrics.fold() adds to prometheus_client's
metrics: every exposition is exact, threads racing a fold lose nothing, and under gunicorn's multiprocess
mode a live worker's counts reach the shared files without a scrape of its own (a forked one's are its own)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from ratelimit_app import engine, events, metrics
from tests.cluster import wait_for
from tests.helpers import check, in_threads, make_policy, policy, repeated_meanwhile
from tests.servers import ROOT, site_env
from tests.test_metrics import families, own_outage_log  # noqa: F401  (the fixture)

CALLS = "ratelimit_redis_call_duration_seconds"


def exposed(body: bytes | None = None) -> dict:
    """{(sample name, sorted labels): value} of the metrics' exposition (this process's, unless `body`)."""
    text = (body if body is not None else metrics.exposition()[0]).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in families(text).values() for s in family.samples if s.name.startswith("ratelimit_")}


def decided(found: dict, policy_name: str) -> dict:
    return {dict(labels)["outcome"]: value for (name, labels), value in found.items()
            if name == "ratelimit_decisions_total" and dict(labels)["policy"] == policy_name}


def delta(after: dict, before: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0) - before.get(key, 0)


# --- one process ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_every_outcome_is_exposed_exactly_after_the_requests(client, settings, own_outage_log):  # noqa: F811
    from ratelimit_app.models import Override

    make_policy(name="fold-enforced", action="demo:search", limit=2, key="ip")
    make_policy(name="fold-shadow", action="login", limit=1, key="ip", mode="shadow")
    exempting = make_policy(name="fold-exempt", action="quote", limit=1, key="ip")
    Override.objects.create(policy=exempting, kind="ip", network="203.0.113.0/24", exempt=True, reason="office")
    events.breaker_closed()
    before = exposed()
    get = client.get
    searched = [get("/demo/search/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(5)]
    logged_in = [get("/demo/login/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)]
    quoted = [get("/demo/quote/", REMOTE_ADDR="203.0.113.7").status_code for _ in range(2)]
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    down = get("/demo/search/", REMOTE_ADDR="198.51.100.9").status_code  # not in the deny cache: Redis is asked
    after = exposed()

    assert (searched, logged_in, quoted, down) == ([200, 200, 429, 429, 429], [200, 200, 200], [200, 200], 200)
    assert decided(after, "fold-enforced") == {"allowed": 2, "denied": 3}  # the last two from the deny cache
    assert delta(after, before, "ratelimit_deny_cache_hits_total", policy="fold-enforced") == 2
    assert decided(after, "fold-shadow") == {"allowed": 1, "shadow_denied": 2}
    assert decided(after, "fold-exempt") == {"exempt": 2}
    assert delta(after, before, "ratelimit_outage_requests_total", outcome="allowed") == 1
    asked = 3 + 3  # the searches up to the first refusal, and every login: the histogram's count and buckets
    assert delta(after, before, CALLS + "_count") == delta(after, before, CALLS + "_bucket", le="+Inf") == asked
    assert delta(after, before, CALLS + "_sum") > 0


def test_the_histogram_folded_is_what_observing_each_call_gives():
    """The fold adds to prometheus_client's bucket and sum values (internals, as of 0.26): if they change,
    this fails, and the fold observes each call instead (slower, still right)."""
    assert metrics._batched, "prometheus_client's Histogram internals changed: the fold observes each call"
    values = [0.0, 0.0001, 0.00010001, 0.0003, 0.001, 0.01, 0.5, 1.0, 1.5, 30.0, 0.0001, 2**-20]
    observed, folded = (Histogram("observed", "calls", buckets=metrics.LATENCY_BUCKETS, registry=CollectorRegistry())
                        for _ in range(2))
    for seconds in values:
        observed.observe(seconds)
    metrics.fold_calls(folded, values)
    samples = [[(s.name, s.labels, s.value) for s in histogram.collect()[0].samples if not s.name.endswith("_created")]
               for histogram in (observed, folded)]
    assert samples[1] == samples[0]
    assert ("observed_bucket", {"le": "0.0001"}, 4.0) in samples[1]  # 0.0001 twice on its bound: in (le)


def test_record_call_shows_in_the_exposition_at_once():
    before = exposed()
    for seconds in (0.0001, 0.0002, 0.75, 3.0):
        metrics.record_call(seconds)
    after = exposed()
    assert [delta(after, before, CALLS + "_bucket", le=le) for le in ("0.0001", "0.00025", "0.5", "1.0", "+Inf")] == [
        1, 2, 2, 3, 4]
    assert delta(after, before, CALLS + "_sum") == pytest.approx(3.7503, rel=1e-9)


def test_a_fold_racing_with_requests_from_several_threads_loses_nothing():
    raced = policy(limit=1)
    admitted, refused = engine.decide([check(raced)]), engine.decide([check(raced)])
    assert (admitted.allowed, refused.allowed) == (True, False)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change hands as often as the interpreter lets them
    threads, each = 8, 2000
    before = exposed()

    def requests() -> None:
        for _ in range(each):
            metrics.record_verdict(admitted)
            metrics.record_verdict(refused)
            metrics.record_call(0.0005)
            metrics.deny_cache_hit(raced)

    try:
        with repeated_meanwhile(metrics.fold):
            assert in_threads(requests, threads)[1] == []
    finally:
        sys.setswitchinterval(switch)
    after = exposed()
    total = threads * each
    assert decided(after, raced.name) == {"allowed": total, "denied": total}
    assert delta(after, before, "ratelimit_deny_cache_hits_total", policy=raced.name) == total
    assert delta(after, before, CALLS + "_bucket", le="0.0005") == delta(after, before, CALLS + "_count") == total


# --- gunicorn's multiprocess mode --------------------------------------------------------------


def _worker(database, shared, code: str) -> subprocess.Popen:
    """A process that runs `code` with the metrics in `shared`, prints 'recorded', then waits for its stdin."""
    script = "import django\ndjango.setup()\nfrom ratelimit_app import engine, metrics\n" + textwrap.dedent(code) + (
        "\nprint('recorded', flush=True)\nsys.stdin.read()\n")
    env = site_env(database, PROMETHEUS_MULTIPROC_DIR=str(shared))
    return subprocess.Popen([sys.executable, "-c", "import sys\n" + script], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_live_workers_counts_reach_the_shared_files_without_a_scrape_of_its_own(tmp_path, monkeypatch):
    """One worker decides (Redis asked: the tally's flush folds), the other only meets outages and
    exemptions (no flush: the metrics' own timer folds); neither exits nor serves the scrape."""
    shared = tmp_path / "metrics"
    shared.mkdir()
    deciding = _worker(tmp_path / "db.sqlite3", shared, """
        from tests.helpers import check, policy
        live = policy(limit=2, name="fold-live")
        for _ in range(3):
            metrics.record_verdict(engine.decide([check(live)]))  # each times its Redis call
    """)
    meeting_outages = _worker(tmp_path / "db.sqlite3", shared, """
        from tests.helpers import policy
        metrics.record_outage(True)
        metrics.record_outage(False)
        metrics.record_exempt(policy(name="fold-exempted"))
        for seconds in (0.25, 0.5, 0.125, 2.0):  # as if from the other worker (binary fractions: exact sums)
            metrics.record_call(seconds)
    """)
    workers = [deciding, meeting_outages]
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    try:
        assert [worker.stdout.readline().strip() for worker in workers] == ["recorded", "recorded"]
        deadline = time.monotonic() + 10
        while True:
            found = exposed(metrics.exposition()[0])
            seen = sum(decided(found, "fold-live").values()) + found.get((CALLS + "_count", ()), 0) + sum(
                value for (name, _labels), value in found.items() if name == "ratelimit_outage_requests_total")
            if seen >= 3 + 7 + 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert all(worker.poll() is None for worker in workers)  # both still running
    finally:
        for worker in workers:
            worker.communicate("", timeout=30)
    assert decided(found, "fold-live") == {"allowed": 2, "denied": 1}
    assert found[(CALLS + "_count", ())] == found[(CALLS + "_bucket", (("le", "+Inf"),))] == 3 + 4
    assert found[(CALLS + "_bucket", (("le", "+Inf"),))] - found[(CALLS + "_bucket", (("le", "1.0"),))] == 1  # 2.0
    assert found[(CALLS + "_sum", ())] > 2.875  # and the time of three calls to Redis
    assert found[("ratelimit_outage_requests_total", (("outcome", "allowed"),))] == 1
    assert found[("ratelimit_outage_requests_total", (("outcome", "refused"),))] == 1
    assert decided(found, "fold-exempted") == {"exempt": 1}
    assert [worker.returncode for worker in workers] == [0, 0]


def test_a_forked_worker_does_not_count_what_its_parent_had_not_folded_yet(tmp_path, monkeypatch):
    """gunicorn forks its workers from a master that may have served requests (preload_app)."""
    shared = tmp_path / "metrics"
    shared.mkdir()
    master = _worker(tmp_path / "db.sqlite3", shared, """
        import os
        from tests.helpers import policy
        forking = policy(name="fold-forking")
        for _ in range(2):
            metrics.record_exempt(forking)  # recorded, not folded yet
            metrics.record_call(0.375)
        child = os.fork()
        if child == 0:
            try:
                metrics.record_exempt(forking)
                metrics.record_call(0.0625)
                metrics.fold()  # as at its exit
            finally:
                os._exit(0)
        assert os.waitpid(child, 0)[1] == 0
        metrics.fold()
    """)
    master.communicate("", timeout=60)
    assert master.returncode == 0, master.stderr
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    found = exposed(metrics.exposition()[0])
    assert decided(found, "fold-forking") == {"exempt": 3}
    assert (found[(CALLS + "_count", ())], found[(CALLS + "_sum", ())]) == (3, 0.8125)  # binary fractions: exact


@pytest.mark.django_db
def test_the_records_of_a_thousand_decisions_keep_no_object_of_their_own_for_the_collector(monkeypatch):
    """What the request path records until the fold is made of what exists already: a record that kept
    its Verdict alive (three objects a request) fed Python's garbage collector a collection every ~230
    requests, work every worker paid on the request path."""
    import gc

    # The fold timer must not fire while the fold is held below: blocked on it, it would be armed again by
    # the next record, a thread and its locks each FOLD_SECONDS the loop lasts (seconds on a busy machine),
    # objects that no record keeps. The one armed from here on waits an hour, and is cancelled at the end.
    monkeypatch.setattr(metrics, "FOLD_SECONDS", 3600.0)
    wait_for(lambda: metrics._folder is None, 10, "the fold timer an earlier test armed")
    limited = policy(name="fold-gc", limit=10**6)
    checks = [check(limited)]
    for _ in range(10):
        metrics.record_verdict(engine.decide(checks))
    metrics.fold()
    try:
        with metrics._folding:  # no fold meanwhile: what the records keep stays there
            gc.collect()
            # the fewest of three rounds: other threads (the tally's flush, a saver) make objects meanwhile on a
            # busy machine (170 seen once), while a record that keeps one of its own adds 1,000 to every round
            kept = None
            for _round in range(3):
                before = len(gc.get_objects())
                for _ in range(1000):
                    metrics.record_verdict(engine.decide(checks))
                gained = len(gc.get_objects()) - before
                kept = gained if kept is None else min(kept, gained)
    finally:
        metrics._folder.cancel()
        metrics._folder = None
    metrics.fold()
    assert kept < 100, f"{kept} objects kept by 1,000 records"
