"""A calendar quota's saved usage is what its counter holds after requests settled: 8 processes send requests
admitted on an estimate and settled below or above it, each saving what it saw; the saved row then equals the
counter, to the unit. Saves reaching the database out of order keep the latest count by Redis's clock."""

from __future__ import annotations

import random

import pytest
from django.test import Client

from ratelimit_app import engine, quotas
from ratelimit_app.engine.giveback import carried
from ratelimit_app.models import QuotaUsage
from ratelimit_app.policies import get_index
from tests.helpers import check, in_processes, make_policy
from tests.metering_urls import ESTIMATE
from tests.test_concurrency import _until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.metering_urls")]

IP = "203.0.113.9"


def quota(limit: int = 1_000_000):
    make_policy(name="llm-month", action="llm", strategy="calendar_quota", unit="tokens", limit=limit,
                period="month", time_zone="UTC", window=31 * 86400)
    return next(p for p in get_index().policies if p.name == "llm-month")


def counted(compiled) -> int:
    return engine.decide([check(compiled, f"ip:{IP}")], dry_run=True).decisions[0].count


def _settle_and_save(start, results):
    import os

    client, rng = Client(), random.Random(os.getpid())
    start.wait()
    settled = 0
    for _ in range(25):
        used = rng.randint(0, 2 * ESTIMATE)  # below and above the estimate
        response = client.get(f"/llm/?used={used}", REMOTE_ADDR=IP)
        assert response.status_code == 200, response.status_code
        settled += used if "RateLimit" in response else 0
    carried.send()  # this worker's settles waiting for a write, then what its save would write
    read, _ = quotas._read_counters(dict(quotas.saver._pending))
    results.put((settled, [(key, usage.used, usage.at_us, usage.display) for key, usage in read.items()]))


def test_eight_processes_settling_below_and_above_their_estimates_save_what_the_counter_holds():
    compiled = quota()
    outcomes = in_processes(_settle_and_save, (), timeout=180)
    settled = sum(s for s, _ in outcomes)
    assert _until(lambda: counted(compiled) == settled), (counted(compiled), settled)
    # each worker's save, reaching the database in any order (the test database is this process's own)
    saves = [rows for _, rows in outcomes]
    random.Random(7).shuffle(saves)
    for rows in saves:
        quotas._upsert({key: quotas.Usage(display, used, compiled.generation, None, at_us, compiled)
                        for key, used, at_us, display in rows})
    row = QuotaUsage.objects.get(policy_id=compiled.id)
    print(f"8 processes x 25 requests, estimate {ESTIMATE}: settled {settled}, counter {counted(compiled)}, "
          f"saved {row.used}; the saves' counts {sorted(rows[0][1] for _, rows in outcomes)}")
    assert row.used == counted(compiled) == settled


def test_saves_reaching_the_database_out_of_order_keep_the_latest_count():
    compiled = quota()
    start = compiled.plugin.span(compiled, engine.server_clock.now_ms())[0]
    at = engine.server_clock.now_ms() * 1000
    key = (compiled.id, "subject-key", start, compiled.unit)

    def save(used: int, at_us: int) -> None:
        quotas._upsert({key: quotas.Usage("ip:203.0.113.9", used, compiled.generation, None, at_us, compiled)})

    save(1008, at)
    save(32, at + 1)  # a settle moved the counter back: the later read holds less
    save(1008, at)  # a worker's earlier read, saved last
    assert QuotaUsage.objects.get().used == 32
    save(40, at + 2)
    assert QuotaUsage.objects.get().used == 40
