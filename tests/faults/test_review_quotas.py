"""Calendar quotas attacked as a hostile reviewer would: a worker whose clock has passed the period's end
while Redis still counts the old period (the instant of every month's end, or a drifted host clock), a
subject reset from the live page, a plan lowered then deleted, usage() of an unused month, quotas absent in two
cluster shards. Real Redis, real database (real servers: test_review_quotas_servers.py)."""

from __future__ import annotations

import time

import pytest
import redis
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import engine, operations, quotas
from ratelimit_app.engine import keys
from ratelimit_app.models import Plan, PlanAssignment, PlanLimit, Policy, QuotaUsage
from ratelimit_app.periods import periods_at, zone
from ratelimit_app.policies import compile_policy
from tests.helpers import check, make_policy, move_worker_clock, policy
from tests.test_cluster import cluster, shared_cluster, who_in_other_shards  # noqa: F401 - the cluster fixtures

pytestmark = pytest.mark.django_db(transaction=True)


def monthly(limit: int = 3, **fields):
    return compile_policy(make_policy(name="monthly", strategy="calendar_quota", period="month", time_zone="UTC",
                                      limit=limit, window=1, **fields))


def redis_month(redis_client) -> tuple[int, int]:
    """The start and end (ms) of the month Redis's clock is in."""
    seconds, micros = redis_client.time()
    found = periods_at("month", zone("UTC"), seconds * 1000 + micros // 1000)
    return found.start, found.end


@pytest.fixture
def worker_clock_at(monkeypatch):
    """Set the worker's clock to an instant of the test's choosing, moving on from there (Redis keeps its own)."""
    return lambda instant_ms: move_worker_clock(monkeypatch, instant_ms / 1000 - time.time())


# --- a worker past the period's end while Redis is not -------------------------------------------------


def test_a_refusal_answered_as_the_month_ends_waits_for_the_next_month_not_the_one_after(redis_client, worker_clock_at):
    limited = monthly(limit=2)
    start, end = redis_month(redis_client)
    assert [engine.decide([check(limited)]).allowed for _ in range(3)] == [True, True, False]
    worker_clock_at(end + 1)  # Redis refused just before the month's end; the reply is read just after it
    [refused] = engine.decide([check(limited)]).decisions
    redis_ms = int(redis_client.time()[0]) * 1000
    assert not refused.allowed
    assert refused.retry_after <= (end - redis_ms) / 1000 + 1  # was 31 days: the deny cache held the next month


def test_the_usage_of_a_month_is_never_saved_as_the_next_months(redis_client, worker_clock_at):
    limited = monthly(limit=3)
    start, end = redis_month(redis_client)
    assert engine.decide([check(limited)]).allowed
    worker_clock_at(end + 1)
    assert [engine.decide([check(limited)]).allowed for _ in range(3)] == [True, True, False]
    quotas.saver.save()
    saved = {(row.period_start, row.used) for row in QuotaUsage.objects.all()}
    assert saved == {(quotas.as_datetime(start), 3)}  # was also (the next month, 3): billed twice
    redis_client.delete(keys.counter_key(limited, check(limited).subject.key))  # its counter ends with the month
    next_month = end / 1000 + 1
    assert engine.decide([check(limited)], now=next_month).allowed  # was refused: the month began at 3


def test_a_period_redis_lost_starts_from_the_usage_saved_for_it_by_redis_clock(redis_client, worker_clock_at):
    limited = monthly(limit=10)
    start, end = redis_month(redis_client)
    assert engine.decide([check(limited)], cost=6).allowed
    quotas.saver.save()
    quotas.saver.discard()
    redis_client.flushall()
    worker_clock_at(end + 1)  # the first request after the loss is answered as the month ends
    assert not engine.decide([check(limited)], cost=5).allowed  # was admitted: the month began at 0
    assert engine.decide([check(limited)], cost=4).allowed


# --- a reset from the live page ----------------------------------------------------------------------


@pytest.mark.parametrize("saved", [True, False], ids=["saved", "pending"])
def test_a_subject_reset_on_the_live_page_starts_its_month_afresh(saved):
    limited = monthly(limit=3)
    assert [engine.decide([check(limited)]).allowed for _ in range(4)] == [True, True, True, False]
    if saved:
        quotas.saver.save()
    operations.reset_subject(Policy.objects.get(pk=limited.id), "ip:203.0.113.7")
    limited = compile_policy(Policy.objects.get(pk=limited.id))
    assert engine.decide([check(limited)]).allowed  # was refused: the saved usage came back at once
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 1


def test_resetting_every_subject_of_a_quota_starts_their_month_afresh():
    limited = monthly(limit=3)
    assert all(engine.decide([check(limited, who)]).allowed for who in ("ip:1.1.1.1", "ip:2.2.2.2") for _ in range(3))
    quotas.saver.save()
    assert all(engine.decide([check(limited, "ip:3.3.3.3")]).allowed for _ in range(3))  # not saved yet
    operations.reset_all(Policy.objects.get(pk=limited.id))
    quotas.saver.save()  # what a worker counted before the reset and saves after it is stale
    limited = compile_policy(Policy.objects.get(pk=limited.id))
    assert all(engine.decide([check(limited, who)]).allowed for who in ("ip:1.1.1.1", "ip:2.2.2.2"))
    quotas.saver.discard()
    assert engine.decide([check(limited, "ip:3.3.3.3")]).allowed  # was refused: the stale count was saved


# --- plans on a quota ------------------------------------------------------------------------------


def _statuses(client, times: int) -> list:
    return [client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7", HTTP_X_API_KEY=KEY) for _ in range(times)]


KEY = "sk_live_0123456789abcdef"


def test_a_plan_lowered_below_the_months_usage_then_deleted_leaves_its_customer_refused_until_the_1st(client,
                                                                                                     redis_client):
    row = make_policy(name="searches", action="demo:search", strategy="calendar_quota", period="month",
                      time_zone="UTC", limit=2, window=1, key="header:X-Api-Key")
    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=row, limit=5)
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value=KEY)
    assert [answer.status_code for answer in _statuses(client, 4)] == [200] * 4
    start, end = redis_month(redis_client)
    limit = PlanLimit.objects.get(plan=pro)
    limit.limit = 3
    limit.save()
    [lowered] = _statuses(client, 1)
    assert (lowered.status_code, lowered["RateLimit-Policy"]) == (429, f'"searches";q=3;w={(end - start) // 1000}')
    assert abs(int(lowered["Retry-After"]) - (end / 1000 - time.time())) <= 2
    pro.delete()
    [back] = _statuses(client, 1)
    assert (back.status_code, back["RateLimit-Policy"].split(";")[1]) == (429, "q=2")
    quotas.saver.save()
    assert QuotaUsage.objects.get().used == 4  # the refusals counted nothing


# --- usage() for the customer's dashboard ------------------------------------------------------------


def test_usage_tells_when_an_unused_quota_starts_again_and_leaves_out_what_does_not_apply(redis_client):
    monthly(limit=1000, key="header:X-Api-Key")
    make_policy(name="per-user", strategy="calendar_quota", period="day", time_zone="UTC", limit=5, window=1,
                key="user")
    start, end = redis_month(redis_client)
    [month] = ratelimit_app.usage(_keyed("k-1"))  # anonymous: no per-user
    assert (month.policy, month.used, month.remaining) == ("monthly", 0, 1000)
    assert month.resets_at == quotas.as_datetime(end)  # was now: an unused month "reset" at once
    assert ratelimit_app.usage(_keyed("")) == []  # no key: no quota of the key applies


def _keyed(value: str):
    headers = {"HTTP_X_API_KEY": value} if value else {}
    request = RequestFactory().get("/api/usage", REMOTE_ADDR="203.0.113.9", **headers)
    request.user = AnonymousUser()
    return request


# --- on Redis Cluster ---------------------------------------------------------------------------------


def test_on_a_cluster_a_request_across_shards_answered_as_the_month_ends_stays_in_its_month(cluster, worker_clock_at):
    limited, minute = monthly(limit=2), policy(limit=100, window=60)
    first, second = who_in_other_shards(2)
    both = [check(limited, first), check(minute, second)]
    assert [engine.decide(both).allowed for _ in range(2)] == [True, True]
    node = redis.Redis.from_url(cluster.url)
    start, end = redis_month(node)
    worker_clock_at(end + 1)
    refused = engine.decide(both)
    assert not refused.allowed
    assert refused.decisions[0].retry_after <= (end / 1000 - int(node.time()[0])) + 1  # was 31 days
    quotas.saver.save()
    assert {(row.period_start, row.used) for row in QuotaUsage.objects.all()} == {(quotas.as_datetime(start), 2)}


def test_on_a_cluster_two_quotas_absent_in_two_shards_start_from_their_saved_usage(cluster):
    month, day = monthly(limit=10), compile_policy(make_policy(
        name="daily", strategy="calendar_quota", period="day", time_zone="UTC", limit=10, window=1))
    first, second = who_in_other_shards(2)
    both = [check(month, first), check(day, second)]
    assert engine.decide(both, cost=3).allowed  # was an error: the second shard's absent counter was not asked again
    quotas.saver.save()
    cluster.flush()
    assert [d.count for d in engine.decide(both, cost=3).decisions] == [6, 6]


# --- the database away ----------------------------------------------------------------------------------


def test_while_the_database_refuses_usage_a_worker_keeps_a_bounded_backup_of_it(settings, monkeypatch):
    settings.RATELIMIT_QUOTA_SAVE_SECONDS = 3600  # saved when the test says
    monkeypatch.setattr(quotas, "KEPT_WHILE_REFUSED", 50, raising=False)
    limited = monthly(limit=10)
    table = QuotaUsage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO refused_usage")
    try:
        assert all(engine.decide([check(limited, f"ip:10.0.0.{n}")]).allowed for n in range(80))
        assert quotas.saver.save() == 0  # the database refuses: kept for the next time
        assert all(engine.decide([check(limited, f"ip:10.0.1.{n}")]).allowed for n in range(120))
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE refused_usage RENAME TO {table}")
    assert quotas.saver.save() == 50  # was 200: every subject seen while the database was away was held
    assert engine.decide([check(limited, "ip:10.0.0.1")], dry_run=True).decisions[0].count == 1  # Redis holds it


LAGGED = (
    "A period is started from the saved usage only when Redis has no counter for it: a failover to a replica "
    "that lagged (or a restart from an older snapshot) keeps an older, lower counter, and the usage the database "
    "saved since is not taken into account. Found by this review, not fixed: a fix must tell a counter gone back "
    "from a subject reset on the live page."
)


@pytest.mark.xfail(strict=True, reason=LAGGED)
def test_a_failover_to_a_replica_that_lagged_keeps_the_usage_saved_since(redis_client):
    limited = monthly(limit=10)
    counter = keys.counter_key(limited, check(limited).subject.key)
    assert all(engine.decide([check(limited)]).allowed for _ in range(2))
    lagged = redis_client.dump(counter)  # what the replica had when the master failed
    assert all(engine.decide([check(limited)]).allowed for _ in range(6))
    quotas.saver.save()
    redis_client.restore(counter, redis_client.pttl(counter), lagged, replace=True)  # the replica, promoted
    admitted = sum(engine.decide([check(limited)]).allowed for _ in range(10))
    assert admitted == 2  # 8 saved of 10; is 8: the month's usage since the lag is given again
