"""Metered usage on Redis Cluster: a request's estimates charged in policies whose counters live on
several nodes are each settled on their own node, exactly; 8 processes of random real costs too. Through
a Sentinel: settled on the master it finds."""

from __future__ import annotations

import random

import pytest

from ratelimit_app import engine
from ratelimit_app.values import Adjustment
from tests.helpers import check, in_processes, policy
from tests.test_cluster import cluster, shared_cluster, who_in_other_shards  # noqa: F401 (fixtures)
from tests.test_sentinel import sentinel  # noqa: F401 (a fixture)

STRATEGIES = {
    "fixed_window": {"window": 31_622_400},
    "sliding_window": {"window": 3600, "bucket_size": 60},
    "token_bucket": {"window": 31_622_400, "limit": 1_000_000, "burst": 100_000},
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_request_spanning_nodes_is_settled_on_each(cluster, strategy):  # noqa: F811
    shape = {"limit": 100_000, **STRATEGIES[strategy]}
    per_ip, per_user = policy(strategy=strategy, unit="tokens", **shape), policy(
        strategy=strategy, unit="tokens", key="user", **shape)
    first, second = who_in_other_shards(2)
    checks = [check(per_ip, first), check(per_user, second)]
    verdict = engine.decide(checks, cost=10)
    assert verdict.allowed and len(verdict.metered) == 2
    engine.release([Adjustment(charged, 1824) for charged in verdict.metered])
    assert [d.count for d in engine.decide(checks, dry_run=True).decisions] == [1834, 1834]


def test_a_request_policy_on_another_node_than_the_metered_one_counts_one_request(cluster):  # noqa: F811
    # each shard is sent only its own checks: the requests policy's alone (then the cost is its 1)
    requests, tokens = policy(limit=2), policy(unit="tokens", limit=10_000, key="user")
    first, second = who_in_other_shards(2)
    checks = [check(requests, first), check(tokens, second)]
    for _ in range(2):
        assert [d.cost for d in engine.decide(checks, cost=1008).decisions] == [1, 1008]
    refused = engine.decide(checks, cost=1008)
    assert not refused.allowed and refused.decisions[0].exceeded and not refused.decisions[1].exceeded
    assert [d.count for d in engine.decide(checks, dry_run=True).decisions] == [2, 2016]


def _settling(checks, start, results, attempts=40):
    rng = random.Random()
    start.wait()
    settled = 0
    for _ in range(attempts):
        verdict = engine.decide(checks, cost=10)
        if verdict.allowed:
            used = rng.randint(0, 200)
            engine.release([Adjustment(charged, used - 10) for charged in verdict.metered])
            settled += used
    results.put(settled)


def test_eight_processes_settle_a_counter_on_a_cluster_to_the_unit(cluster):  # noqa: F811
    limited = policy(strategy="sliding_window", limit=30_000, window=3600, bucket_size=60, unit="tokens")
    checks = [check(limited)]
    settled = sum(in_processes(_settling, (checks,)))
    assert engine.decide(checks, dry_run=True).decisions[0].count == settled


@pytest.mark.django_db
@pytest.mark.urls("tests.metering_urls")
def test_a_view_behind_a_sentinel_settles_on_its_master(client, sentinel, settings):  # noqa: F811
    from tests.helpers import make_policy
    from tests.test_concurrency import _until
    from ratelimit_app.policies import get_index

    cache = settings.CACHES["sentinel"]  # a loaded machine: a reply late by 0.25 s would leave a request undecided
    settings.CACHES = {**settings.CACHES, "sentinel": {**cache, "OPTIONS": {**cache["OPTIONS"], "SOCKET_TIMEOUT": 5}}}
    make_policy(name="llm-tokens", action="llm", limit=1000, window=3600, unit="tokens")
    assert client.get("/llm/?used=700", REMOTE_ADDR="203.0.113.7").status_code == 200
    assert client.get("/llm/?used=400", REMOTE_ADDR="203.0.113.7").status_code == 200  # admitted on 710 + 10
    assert client.get("/llm/?used=1", REMOTE_ADDR="203.0.113.7").status_code == 429  # 1,100: in debt
    compiled = next(p for p in get_index().policies if p.name == "llm-tokens")
    key = engine.counter_key(compiled, check(compiled, "ip:203.0.113.7").subject.key)
    assert _until(lambda: int(sentinel.master.client.get(key) or 0) // 1_000_000 == 1100)
