"""Each strategy against a small model in Python: random sequences of times, subjects and limit
changes (hypothesis), decided by the real Lua on the real server, must admit, count and tell the
retry time exactly as the model does; the live page must count what the engine counts. Then the
window edges on the server's real clock."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ratelimit_app import engine, live
from tests.helpers import check, policy

T0 = 1_800_000_000_000  # ms, a boundary of every window used here
SUBJECTS = ["ip:198.51.100.1", "ip:198.51.100.2", "user:7"]


@dataclass
class Model:
    """What a strategy should do, written the plain way: every admitted request kept with its time."""

    strategy: str
    window: int  # ms
    bucket: int  # ms (sliding_window)
    admitted: dict[str, list[int]] = field(default_factory=dict)

    def counted(self, who: str, now: int) -> list[int]:
        times = self.admitted.get(who, [])
        if self.strategy == "fixed_window":
            return [t for t in times if t // self.window == now // self.window]
        if self.strategy == "sliding_window":  # whole buckets: a bucket counts until its last ms leaves
            oldest = now // self.bucket - self.window // self.bucket + 1
            return [t for t in times if t // self.bucket >= oldest]
        return [t for t in times if t > now - self.window]

    def retry(self, who: str, now: int, limit: int) -> int:
        """ms until one more request would be admitted, for a subject at or over its limit."""
        times = sorted(self.counted(who, now))
        if self.strategy == "fixed_window":
            return (now // self.window + 1) * self.window - now
        leaving = times[len(times) - limit]  # once this one has left, limit - 1 remain
        if self.strategy == "sliding_window":
            return (leaving // self.bucket) * self.bucket + self.window - now
        return leaving + self.window - now

    def empty_in(self, who: str, now: int) -> int:
        """ms until every counted request of the subject has left the window."""
        times = self.counted(who, now)
        if not times:
            return 0
        if self.strategy == "fixed_window":
            return (now // self.window + 1) * self.window - now
        if self.strategy == "sliding_window":
            return (max(times) // self.bucket) * self.bucket + self.window - now
        return max(times) + self.window - now

    def decide(self, who: str, now: int, limit: int) -> tuple[bool, int]:
        count = len(self.counted(who, now))
        if count >= limit:
            return False, count
        self.admitted.setdefault(who, []).append(now)
        return True, count + 1


STRATEGY_SHAPES = {
    "fixed_window": {"window": 4},
    "sliding_window": {"window": 4, "bucket_size": 1},
    "sliding_log": {"window": 4},
}

steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=1500),  # ms since the previous request
        st.sampled_from(SUBJECTS),
        st.integers(min_value=1, max_value=4),  # the limit in effect (policy edits, overrides)
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
    model = Model(strategy, limited.window_ms, limited.bucket_ms)
    now = T0
    for gap, who, limit in sequence:
        now += gap
        expected_allowed, expected_count = model.decide(who, now, limit)
        [decision] = engine.decide([check(limited, who, limit)], now=now / 1000).decisions
        assert (decision.allowed, decision.count) == (expected_allowed, expected_count), (who, now - T0, limit)
        if not decision.allowed:
            assert round(decision.retry_after * 1000) == model.retry(who, now, limit), (who, now - T0, limit)
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
    if strategy != "sliding_log" and lasting == set(expected):  # sliding_log's totals slide in steps
        assert usage.allowed == sum(shown.values())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps, shapes=st.permutations(list(STRATEGY_SHAPES)))
def test_policies_decided_together_count_all_or_nothing(redis_client, sequence, shapes):
    redis_client.flushdb()
    first = policy(strategy=shapes[0], limit=4, **STRATEGY_SHAPES[shapes[0]])
    second = policy(strategy=shapes[1], limit=3, **STRATEGY_SHAPES[shapes[1]])
    models = [Model(p.strategy, p.window_ms, p.bucket_ms) for p in (first, second)]
    now = T0
    for gap, who, limit in sequence:
        now += gap
        limits = (limit, 3)
        admits = all(len(m.counted(who, now)) < lim for m, lim in zip(models, limits))
        if admits:
            for m, lim in zip(models, limits):
                m.decide(who, now, lim)
        verdict = engine.decide([check(first, who, limit), check(second, who, 3)], now=now / 1000)
        assert verdict.allowed == admits
        assert [d.count for d in verdict.decisions] == [len(m.counted(who, now)) for m in models]


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
