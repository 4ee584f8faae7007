"""Each strategy against a small model in Python: random sequences of times, subjects and limit
changes (hypothesis), decided by the real Lua on the real server, must admit, count and tell the
retry time exactly as the model does; the live page must count what the engine counts. Then the
window edges on the server's real clock."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ratelimit_app import engine, live, strategies
from tests import test_quotas, test_token_bucket
from tests.helpers import check, policy

T0 = 1_800_000_000_000  # ms, a boundary of every window used here
SUBJECTS = ["ip:198.51.100.1", "ip:198.51.100.2", "user:7"]


@dataclass
class Model:
    """What a strategy should do, written the plain way: every admitted request kept with its time.
    A strategy's model says which of them still count, and when one leaves (times in ms)."""

    window: int
    bucket: int  # the policy's bucket_ms (a sliding window's bucket)
    admitted: dict[str, list[int]] = field(default_factory=dict)

    def still_counted(self, time: int, now: int) -> bool:
        return time > now - self.window

    def leaves_at(self, time: int) -> int:
        """When a request admitted at `time` stops counting."""
        return time + self.window

    def counted(self, who: str, now: int) -> list[int]:
        return [t for t in self.admitted.get(who, []) if self.still_counted(t, now)]

    def retry(self, who: str, now: int, limit: int, cost: int = 1) -> int | None:
        """ms until `cost` more units would be admitted, for a subject without room for them (None:
        a cost above the limit never fits)."""
        if cost > limit:
            return None
        times = sorted(self.counted(who, now))
        return self.leaves_at(times[len(times) + cost - limit - 1]) - now  # then limit - cost remain

    def empty_in(self, who: str, now: int) -> int:
        """ms until every counted request of the subject has left the window."""
        times = self.counted(who, now)
        return max(self.leaves_at(t) for t in times) - now if times else 0

    def decide(self, who: str, now: int, limit: int, cost: int = 1) -> tuple[bool, int]:
        """A request of `cost` units: all of them admitted (one entry each), or none."""
        count = len(self.counted(who, now))
        if count + cost > limit:
            return False, count
        self.admitted.setdefault(who, []).extend([now] * cost)
        return True, count + cost


class FixedWindow(Model):
    def still_counted(self, time: int, now: int) -> bool:
        return time // self.window == now // self.window

    def leaves_at(self, time: int) -> int:
        return (time // self.window + 1) * self.window


class SlidingWindow(Model):  # whole buckets: a bucket counts until its last ms leaves
    def still_counted(self, time: int, now: int) -> bool:
        return time // self.bucket >= now // self.bucket - self.window // self.bucket + 1

    def leaves_at(self, time: int) -> int:
        return (time // self.bucket) * self.bucket + self.window


class InFlight(Model):
    """Requests in flight that are never given back (test_concurrency.py gives them back): each holds
    its place for the lease (the window); a refusal says to retry in a second, or when a lease runs out sooner."""

    def retry(self, who: str, now: int, limit: int, cost: int = 1) -> int | None:
        exact = super().retry(who, now, limit, cost)
        return None if exact is None else min(1000, exact)


# one row per strategy: its model and the policy shape it is decided with (the token bucket has a
# model of its own in test_token_bucket.py)
MODELS = {
    "fixed_window": (FixedWindow, {"window": 4}),
    "sliding_window": (SlidingWindow, {"window": 4, "bucket_size": 1}),
    "sliding_log": (Model, {"window": 4}),
    "concurrency": (InFlight, {"window": 4}),
}
STRATEGY_SHAPES = {name: shape for name, (_model, shape) in MODELS.items()}
# the strategies decided against a reference model of their own, by the test that does it
ELSEWHERE = {
    "token_bucket": test_token_bucket.test_decisions_match_the_reference_model,
    "calendar_quota": test_quotas.test_the_quota_strategy_decides_as_the_calendar_does,
}


def test_every_strategy_is_decided_against_a_reference_model():
    """A strategy added to the registry fails here until it has its row in MODELS (or ELSEWHERE), and
    each declares (`reference`, which the registry requires) the model or the test that decides it."""
    assert sorted(strategies.STRATEGIES) == sorted([*MODELS, *ELSEWHERE]), "add the strategy's row to MODELS"
    for name, strategy in strategies.STRATEGIES.items():
        path, _, attribute = strategy.reference.partition("::")
        declared = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), attribute)
        assert declared is (MODELS[name][0] if name in MODELS else ELSEWHERE[name]), name


def model_of(compiled) -> Model:
    return MODELS[compiled.strategy][0](compiled.window_ms, compiled.bucket_ms)


steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=1500),  # ms since the previous request
        st.sampled_from(SUBJECTS),
        st.integers(min_value=1, max_value=4),  # the limit in effect (policy edits, overrides)
        st.sampled_from([1, 1, 1, 2, 3, 5]),  # the request's cost (5: above every limit, never fits)
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("strategy", list(STRATEGY_SHAPES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps)
def test_each_strategy_decides_as_the_model_does(redis_client, strategy, sequence):
    redis_client.flushdb()
    limited = policy(strategy=strategy, limit=4, **STRATEGY_SHAPES[strategy])
    model = model_of(limited)
    now, requests, leases = T0, [], []  # the requests admitted: the totals count requests, the counters units
    for gap, who, limit, cost in sequence:
        now += gap
        leases.append(now)  # each request its own lease (an in-flight policy names its places after it)
        expected_allowed, expected_count = model.decide(who, now, limit, cost)
        requests += [(who, now)] if expected_allowed else []
        [decision] = engine.decide([check(limited, who, limit)], now=now / 1000, cost=cost, lease=f"r{len(leases)}").decisions
        where = (who, now - T0, limit, cost)
        assert (decision.allowed, decision.count, decision.remaining) == (
            expected_allowed, expected_count, max(limit - expected_count, 0)
        ), where
        if not decision.allowed:
            retry = decision.retry_after
            assert (None if retry is None else round(retry * 1000)) == model.retry(who, now, limit, cost), where
    # the live page counts what the engine counts, subject by subject, and in its totals. Counters
    # expire on the server's real clock, `now` (ms) ahead of this test's: a counter the model
    # empties within a few ms may already be gone, and only those may be missing.
    usage = live.live_usage(limited, now=now / 1000)
    shown = {s.display: s.count for s in usage.subjects}
    expected = {who: len(model.counted(who, now)) for who in SUBJECTS if model.counted(who, now)}
    lasting = {who for who in expected if model.empty_in(who, now) > 500}
    assert {who: count for who, count in shown.items() if who not in lasting} == {
        who: count for who, count in expected.items() if who not in lasting and who in shown
    }
    assert {who: shown.get(who) for who in lasting} == {who: expected[who] for who in lasting}
    # totals kept in the strategy's own buckets count what it counts; finer ones (the window in steps, when
    # the strategy counts every instant) slide in steps
    if limited.totals_bucket_ms == limited.bucket_ms and lasting == set(expected):
        assert usage.allowed == len([1 for who, when in requests if who in shown and model.still_counted(when, now)])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps, shapes=st.permutations(list(STRATEGY_SHAPES)))
def test_policies_decided_together_count_all_or_nothing(redis_client, sequence, shapes):
    redis_client.flushdb()
    first = policy(strategy=shapes[0], limit=4, **STRATEGY_SHAPES[shapes[0]])
    second = policy(strategy=shapes[1], limit=3, **STRATEGY_SHAPES[shapes[1]])
    models = [model_of(p) for p in (first, second)]
    now = T0
    leases = []
    for gap, who, limit, cost in sequence:
        now += gap
        leases.append(now)
        limits = (limit, 3)
        admits = all(len(m.counted(who, now)) + cost <= lim for m, lim in zip(models, limits))
        if admits:
            for m, lim in zip(models, limits):
                m.decide(who, now, lim, cost)
        verdict = engine.decide([check(first, who, limit), check(second, who, 3)], now=now / 1000, cost=cost, lease=f"r{len(leases)}")
        assert verdict.allowed == admits
        assert [d.count for d in verdict.decisions] == [len(m.counted(who, now)) for m in models]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps, counting=st.sampled_from(list(STRATEGY_SHAPES)),
       metering=st.sampled_from([name for name in STRATEGY_SHAPES if strategies.STRATEGIES[name].counts_units]))
def test_a_request_policy_beside_a_metered_one_counts_one_request_of_any_cost(redis_client, sequence, counting,
                                                                              metering):
    """All or nothing as above, each policy charged in its own unit: the metered one the request's cost,
    the one counting requests one request."""
    redis_client.flushdb()
    requests = policy(strategy=counting, limit=3, **STRATEGY_SHAPES[counting])
    units = policy(strategy=metering, limit=4, unit="tokens", **STRATEGY_SHAPES[metering])
    models = [model_of(p) for p in (requests, units)]
    now = T0
    for n, (gap, who, limit, cost) in enumerate(sequence):
        now += gap
        charges = (1, cost)
        admits = all(len(m.counted(who, now)) + c <= lim for m, c, lim in zip(models, charges, (3, limit)))
        if admits:
            for m, c, lim in zip(models, charges, (3, limit)):
                m.decide(who, now, lim, c)
        verdict = engine.decide([check(requests, who, 3), check(units, who, limit)], now=now / 1000, cost=cost,
                                lease=f"m{n}")
        assert verdict.allowed == admits, (who, now - T0, limit, cost)
        assert [d.count for d in verdict.decisions] == [len(m.counted(who, now)) for m in models]
        assert [d.cost for d in verdict.decisions] == [1, cost]


# --- on the server's clock --------------------------------------------------------------------

ON_THE_SERVERS_CLOCK = {**STRATEGY_SHAPES, "fixed_window": {"window": 3600}, "sliding_log": {"window": 3600},
                        "sliding_window": {"window": 3600, "bucket_size": 60}, "concurrency": {"window": 3600}}


@pytest.mark.parametrize("strategy", list(ON_THE_SERVERS_CLOCK))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps)
def test_on_the_servers_clock_each_strategy_decides_as_the_model_does(redis_client, strategy, sequence):
    """Without `now` the scripts read the server's clock only when they need it (a fixed window's
    counter that exists is its window's): within one window, the same answers as the model's."""
    redis_client.flushdb()
    edge = 3600 - server_time(redis_client) % 3600
    if edge < 5:  # a window edge during the sequence would make it two windows
        time.sleep(edge + 0.1)
    limited = policy(strategy=strategy, limit=4, **ON_THE_SERVERS_CLOCK[strategy])
    model = model_of(limited)
    now = int(server_time(redis_client) * 1000)  # nothing leaves a window of an hour meanwhile
    for n, (_gap, who, limit, cost) in enumerate(sequence):
        expected_allowed, expected_count = model.decide(who, now, limit, cost)
        [decision] = engine.decide([check(limited, who, limit)], cost=cost, lease=f"s{n}").decisions
        assert (decision.allowed, decision.count, decision.remaining) == (
            expected_allowed, expected_count, max(limit - expected_count, 0)
        ), (who, limit, cost)


# --- the window's edge on the server's real clock ----------------------------------------------


def server_time(redis_client) -> float:
    seconds, micros = redis_client.time()
    return seconds + micros / 1_000_000


def sleep_until(redis_client, moment: float) -> None:
    time.sleep(max(0.0, moment - server_time(redis_client)))


@pytest.mark.parametrize(
    "strategy, admitted_after_the_edge",
    [("fixed_window", 2), ("sliding_window", 0), ("sliding_log", 0)],
)
def test_what_each_strategy_admits_across_a_window_edge_on_the_real_clock(redis_client, strategy, admitted_after_the_edge):
    """A full window just before its edge: a fixed window admits a whole limit again right after
    the edge, the sliding strategies nothing until the requests before it leave."""
    shape = {"window": 2, "bucket_size": 1} if strategy == "sliding_window" else {"window": 2}
    limited = policy(strategy=strategy, limit=2, **shape)
    edge = (int(server_time(redis_client)) // 2 + 1) * 2  # the next edge of a 2 s window
    if edge - server_time(redis_client) < 0.3:
        edge += 2
    sleep_until(redis_client, edge - 0.2)
    before = [engine.decide([check(limited)]).allowed for _ in range(3)]
    sleep_until(redis_client, edge + 0.1)
    after = [engine.decide([check(limited)]).allowed for _ in range(3)]
    assert before == [True, True, False]
    assert sum(after) == admitted_after_the_edge
