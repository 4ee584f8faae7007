"""Settled usage against the reference models: a request admitted on its estimate, then settled with
what it really used, moves its counters by the difference in the window (or bucket, or period) it was
charged in; usage beyond the limit is debt, refused until it has left the window. Decided by the real
Lua on the real server (lua/settle.lua), with `now` moved by the test."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ratelimit_app import engine
from ratelimit_app.engine.settling import settle_commands
from ratelimit_app.values import Adjustment
from tests.helpers import check, policy
from tests.test_strategies_property import T0, FixedWindow, SlidingWindow

SUBJECTS = ["ip:198.51.100.1", "ip:198.51.100.2"]
METERED = {
    "fixed_window": (FixedWindow, {"window": 4}),
    "sliding_window": (SlidingWindow, {"window": 4, "bucket_size": 1}),
}


def settle(adjustments, now_ms=None) -> None:
    """Send the settle of `adjustments` and wait for it (the closing step does not wait)."""
    client = engine.client()
    for _key, command, _group in settle_commands(adjustments, None, now_ms):
        client.execute_command(*command)


class Settled:
    """A model's admitted units, each with the time its request was charged, per request: a settle adds
    units at that time, or takes that request's own units back, while they still count."""

    def __init__(self, model) -> None:
        self.model = model

    def settle(self, who: str, charged_at: int, units: int, now: int) -> None:
        if not self.model.still_counted(charged_at, now):
            return  # its window ended: its units no longer count, nothing moves
        times = self.model.admitted.setdefault(who, [])
        if units > 0:
            times.extend([charged_at] * units)
        for _ in range(-units):
            times.remove(charged_at)


steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=1500),  # ms since the previous step
        st.sampled_from(SUBJECTS),
        st.integers(min_value=1, max_value=5),  # the estimate (the request's cost)
        st.integers(min_value=0, max_value=12),  # what it really used (above the limit: debt)
        st.integers(min_value=0, max_value=1500),  # ms from its decision to its settle
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize("strategy", list(METERED))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=steps)
def test_settled_counters_move_as_the_model_does(redis_client, strategy, sequence):
    redis_client.flushdb()
    model_class, shape = METERED[strategy]
    limited = policy(strategy=strategy, limit=8, unit="tokens", **shape)
    model = model_class(limited.window_ms, limited.bucket_ms)
    settled = Settled(model)
    now = T0
    for gap, who, estimate, used, later in sequence:
        now += gap
        allowed, count = model.decide(who, now, 8, estimate)
        verdict = engine.decide([check(limited, who)], now=now / 1000, cost=estimate)
        [decision] = verdict.decisions
        where = (who, now - T0, estimate, used)
        assert (decision.allowed, decision.count, decision.remaining) == (allowed, count, max(8 - count, 0)), where
        if not decision.allowed:
            retry = decision.retry_after
            assert (None if retry is None else round(retry * 1000)) == model.retry(who, now, 8, estimate), where
            continue
        [charged] = verdict.metered
        assert (charged.policy, charged.estimate) == (limited, estimate)
        charged_at, now = now, now + later
        settled.settle(who, charged_at, used - estimate, now)
        settle([Adjustment(charged, used - estimate)], now)
        [looked] = engine.decide([check(limited, who)], now=now / 1000, dry_run=True).decisions
        assert looked.count == len(model.counted(who, now)), (where, "settled")
        assert looked.remaining == max(8 - looked.count, 0)  # debt: nothing remains


def test_a_request_settled_over_the_limit_leaves_debt_until_its_window_ends(redis_client):
    limited = policy(strategy="fixed_window", limit=100, window=60, unit="tokens")
    verdict = engine.decide([check(limited)], now=T0 / 1000, cost=10)
    settle([Adjustment(verdict.metered[0], 250 - 10)], T0)
    [refused] = engine.decide([check(limited)], now=(T0 + 30_000) / 1000, cost=1).decisions
    assert (refused.allowed, refused.count, refused.remaining, refused.retry_after) == (False, 250, 0, 30.0)
    [admitted] = engine.decide([check(limited)], now=(T0 + 60_000) / 1000, cost=1).decisions
    assert (admitted.allowed, admitted.count) == (True, 1)


def test_units_given_back_never_take_a_counter_below_zero(redis_client):
    limited = policy(strategy="sliding_window", limit=100, window=60, bucket_size=10, unit="tokens")
    verdict = engine.decide([check(limited)], now=T0 / 1000, cost=10)
    redis_client.delete(engine.counter_key(limited, verdict.decisions[0].subject.key))  # reset meanwhile
    engine.decide([check(limited)], now=T0 / 1000, cost=3)
    settle([Adjustment(verdict.metered[0], -10)], T0)
    [looked] = engine.decide([check(limited)], now=T0 / 1000, dry_run=True).decisions
    assert looked.count == 0


def test_a_settle_after_its_window_ended_moves_nothing(redis_client):
    limited = policy(strategy="fixed_window", limit=100, window=60, unit="tokens")
    first = engine.decide([check(limited)], now=T0 / 1000, cost=10)
    engine.decide([check(limited)], now=(T0 + 60_000) / 1000, cost=5)  # the next window's counter
    settle([Adjustment(first.metered[0], 40)], T0 + 60_000)
    [looked] = engine.decide([check(limited)], now=(T0 + 60_000) / 1000, dry_run=True).decisions
    assert looked.count == 5


def test_a_token_bucket_moves_its_arrival_time_by_the_units_settled(redis_client):
    # 100 tokens a minute with a burst of 100: a token every 600 ms
    limited = policy(strategy="token_bucket", limit=100, window=60, unit="tokens")
    verdict = engine.decide([check(limited)], now=T0 / 1000, cost=10)
    assert verdict.metered[0][3:] == ("t", 600_000, 100)
    settle([Adjustment(verdict.metered[0], 140)], T0)  # used 150: 50 tokens of debt
    [refused] = engine.decide([check(limited)], now=T0 / 1000, cost=1).decisions
    assert (refused.allowed, refused.count, refused.remaining) == (False, 150, 0)
    assert refused.retry_after == pytest.approx(0.6 * 51)  # 50 tokens of debt, then one more
    settle([Adjustment(verdict.metered[0], -145)], T0)  # given back: to a full bucket, not beyond
    [looked] = engine.decide([check(limited)], now=T0 / 1000, dry_run=True).decisions
    assert looked.count == 5 and looked.allowed
    settle([Adjustment(verdict.metered[0], -100)], T0)
    [looked] = engine.decide([check(limited)], now=T0 / 1000, dry_run=True).decisions
    assert looked.count == 0


@pytest.mark.django_db
def test_a_calendar_quota_settles_in_the_period_it_was_charged_in(redis_client):
    quota = policy(strategy="calendar_quota", limit=1_000_000, window=31 * 86400, period="month", time_zone="UTC",
                   unit="tokens")
    verdict = engine.decide([check(quota)], cost=1000)
    settle([Adjustment(verdict.metered[0], 7_412_009 - 1000)])
    [looked] = engine.decide([check(quota)], dry_run=True).decisions
    assert (looked.count, looked.remaining, looked.allowed) == (7_412_009, 0, False)


@pytest.mark.django_db
@pytest.mark.parametrize(("strategy", "shape", "commands"), [
    ("fixed_window", {"window": 3600}, 3),  # the EVAL, GET, INCRBY
    ("sliding_window", {"window": 3600, "bucket_size": 60}, 4),  # the EVAL, HMGET, two HINCRBY
    ("token_bucket", {"window": 3600}, 4),  # the EVAL, TIME, GET, SET
    ("calendar_quota", {"period": "month", "time_zone": "UTC", "window": 31 * 86400}, 3),
])
def test_a_settle_runs_few_server_commands(redis_client, strategy, shape, commands):
    """What settling costs Redis (INFO commandstats: the script itself and each command it runs)."""
    from tests.helpers import server_commands_per_call

    limited = policy(strategy=strategy, limit=10**6, unit="tokens", **shape)
    charged = engine.decide([check(limited)], cost=10).metered[0]
    settle([Adjustment(charged, 5)])
    assert server_commands_per_call(redis_client, lambda: settle([Adjustment(charged, 5)])) == commands
