"""The engine decides every policy of a request in one Redis call, exactly and all-or-nothing."""

from __future__ import annotations

import time

import pytest

from ratelimit_app.engine.tally import tally
from ratelimit_app import engine
from ratelimit_app.rates import MAX_WINDOW
from tests.helpers import check, count_round_trips, in_processes, policy, server_commands_per_call

T0 = 1_800_000_000.0  # a window boundary for every window used here (divisible by 60 and 3600)
STRATEGIES = ["fixed_window", "sliding_window", "sliding_log"]


def hit(*checks, now, dry_run=False):
    return engine.decide(list(checks), now=now, dry_run=dry_run)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_admits_up_to_the_limit_then_denies(strategy):
    limited = policy(strategy=strategy, limit=3, window=60)
    verdicts = [hit(check(limited), now=T0 + i) for i in range(5)]
    assert [v.allowed for v in verdicts] == [True, True, True, False, False]
    assert [v.decisions[0].remaining for v in verdicts] == [2, 1, 0, 0, 0]
    assert [v.decisions[0].count for v in verdicts] == [1, 2, 3, 3, 3]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_subjects_are_counted_apart(strategy):
    limited = policy(strategy=strategy, limit=1)
    assert hit(check(limited, "ip:198.51.100.1"), now=T0).allowed
    assert hit(check(limited, "ip:198.51.100.2"), now=T0).allowed
    assert not hit(check(limited, "ip:198.51.100.1"), now=T0 + 1).allowed


def test_fixed_window_starts_over_in_the_next_window():
    limited = policy(strategy="fixed_window", limit=2, window=60)
    hit(check(limited), now=T0 + 10)
    hit(check(limited), now=T0 + 20)
    denied = hit(check(limited), now=T0 + 30)
    assert not denied.allowed
    assert denied.decisions[0].retry_after == pytest.approx(30)
    assert denied.decisions[0].reset_in == pytest.approx(30)
    assert hit(check(limited), now=T0 + 60).allowed


@pytest.mark.parametrize("strategy", ["sliding_window", "sliding_log"])
def test_sliding_strategies_refuse_the_burst_a_fixed_window_admits_at_its_edge(strategy):
    fixed = policy(strategy="fixed_window", limit=10, window=60)
    sliding = policy(strategy=strategy, limit=10, window=60)
    admitted = {"fixed": 0, "sliding": 0}
    for second in (T0 + 59.5, T0 + 60.5):  # ten requests just before the fixed edge, ten just after
        for _ in range(10):
            admitted["fixed"] += hit(check(fixed), now=second).allowed
            admitted["sliding"] += hit(check(sliding), now=second).allowed
    assert admitted == {"fixed": 20, "sliding": 10}


def test_sliding_window_frees_buckets_as_they_leave_the_window():
    limited = policy(strategy="sliding_window", limit=4, window=60, bucket_size=10)
    for second in (0, 0, 25, 25):
        assert hit(check(limited), now=T0 + second).allowed
    denied = hit(check(limited), now=T0 + 30)
    assert not denied.allowed
    assert denied.decisions[0].retry_after == pytest.approx(30)  # the bucket of second 0 leaves at 60
    assert denied.decisions[0].reset_in == pytest.approx(50)  # the bucket of second 20 leaves at 80
    assert not hit(check(limited), now=T0 + 59.9).allowed
    assert [hit(check(limited), now=T0 + 60).allowed for _ in range(3)] == [True, True, False]


def test_sliding_window_memory_is_bounded_by_its_buckets(redis_client):
    limited = policy(strategy="sliding_window", limit=10_000, window=60, bucket_size=10)
    for second in range(0, 600, 5):  # ten minutes of traffic
        hit(check(limited), now=T0 + second)
    counter_key = next(k for k in redis_client.keys("rl:{*") if b":s60/10" in k)
    assert redis_client.hlen(counter_key) <= 60 // 10 + 3  # the buckets, their total, two bucket numbers


def test_sliding_log_counts_every_request_within_one_millisecond(redis_client):
    limited = policy(strategy="sliding_log", limit=50, window=60)
    verdicts = [hit(check(limited), now=T0) for _ in range(51)]
    assert sum(v.allowed for v in verdicts) == 50
    assert verdicts[49].decisions[0].count == 50
    assert redis_client.zcard(next(iter(redis_client.keys("rl:{*")))) == 50


def test_sliding_log_admits_again_when_the_oldest_request_leaves():
    limited = policy(strategy="sliding_log", limit=2, window=60)
    hit(check(limited), now=T0)
    hit(check(limited), now=T0 + 30)
    denied = hit(check(limited), now=T0 + 45)
    assert denied.decisions[0].retry_after == pytest.approx(15)
    assert hit(check(limited), now=T0 + 60.001).allowed
    assert not hit(check(limited), now=T0 + 61).allowed


def test_sliding_log_admits_no_more_than_its_limit_after_the_clock_steps_back():
    limited = policy(strategy="sliding_log", limit=4, window=1)
    assert all(hit(check(limited), now=T0 - 0.5).allowed for _ in range(3))
    assert hit(check(limited), now=T0).allowed  # the 4th of the window
    assert not hit(check(limited), now=T0 + 0.1).allowed
    assert hit(check(limited), now=T0 + 0.6).allowed  # the three of T0 - 0.5 left the window
    # the clock steps back to T0 (NTP, a failover to a server whose clock is behind): two places are
    # free in the window of T0 (its own request and that of T0 + 0.6 are in it), no more
    stepped_back = [hit(check(limited), now=T0).allowed for _ in range(10)]
    assert stepped_back == [True, True] + [False] * 8


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_denied_requests_are_not_counted(strategy):
    limited = policy(strategy=strategy, limit=3, window=60)
    for i in range(3):
        hit(check(limited), now=T0 + i)
    for i in range(200):  # a client that keeps hammering
        hit(check(limited), now=T0 + 3 + i * 0.1)
    # one window after the admitted requests the client is welcome again
    assert hit(check(limited), now=T0 + 63).allowed


def test_one_denying_policy_means_nothing_is_counted_anywhere():
    tight = policy(limit=1, strategy="fixed_window")
    loose = policy(limit=10, strategy="sliding_log")
    logged = policy(limit=10, strategy="sliding_window")
    both = [check(tight), check(loose), check(logged)]
    assert hit(*both, now=T0).allowed
    denied = hit(*both, now=T0 + 1)
    assert not denied.allowed
    assert [d.policy.id for d in denied.denied_by] == [tight.id]
    assert [d.count for d in denied.decisions] == [1, 1, 1]
    assert [d.remaining for d in hit(check(loose), check(logged), now=T0 + 2).decisions] == [8, 8]


def test_shadow_policy_reports_but_never_denies_nor_blocks_counting():
    shadow = policy(limit=1, mode="shadow")
    enforced = policy(limit=10)
    verdicts = [hit(check(shadow), check(enforced), now=T0 + i) for i in range(3)]
    assert all(v.allowed for v in verdicts)
    assert [v.decisions[0].exceeded for v in verdicts] == [False, True, True]
    assert [v.decisions[1].count for v in verdicts] == [1, 2, 3]


def test_effective_limit_per_subject_is_what_the_engine_enforces():
    limited = policy(limit=1)
    assert [hit(check(limited, limit=3), now=T0).allowed for _ in range(4)] == [True, True, True, False]


def test_dry_run_decides_without_counting():
    limited = policy(limit=1)
    assert hit(check(limited), now=T0, dry_run=True).allowed
    assert hit(check(limited), now=T0, dry_run=True).decisions[0].count == 0
    assert hit(check(limited), now=T0).allowed
    assert not hit(check(limited), now=T0, dry_run=True).allowed


def test_without_now_every_worker_counts_on_the_servers_clock(redis_client, monkeypatch):
    limited = policy(limit=2, window=60, strategy="fixed_window")
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # this process's clock is far off
    server_minute = int(redis_client.time()[0]) // 60
    decisions = [engine.decide([check(limited)]).decisions[0] for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    [counter] = redis_client.keys("rl:{*")
    assert int(redis_client.get(counter)) % 1_000_000 in (server_minute % 1_000_000, (server_minute + 1) % 1_000_000)
    assert 0 < decisions[0].reset_in <= 60


def test_a_sliding_window_decision_reads_a_few_fields_whatever_the_buckets(redis_client):
    """The running total: no decision reads every bucket (HGETALL) or sums them."""
    limited = policy(strategy="sliding_window", limit=100_000, window=600, bucket_size=1)
    for second in range(500):  # 500 filled buckets
        hit(check(limited), now=T0 + second)
    tally.flush()
    with tally._flushing:  # the worker's background flush of the totals is no decision's work
        redis_client.config_resetstat()
        hit(check(limited), now=T0 + 500)
        calls = {name: stats["calls"] for name, stats in redis_client.info("commandstats").items()}
    assert "cmdstat_hgetall" not in calls and "cmdstat_hvals" not in calls
    assert calls.get("cmdstat_hmget", 0) <= 3  # the subject's total; the totals bucket leaving the window, rolled into the trend


@pytest.mark.parametrize("count", [1, 3, 10])
def test_one_round_trip_whatever_the_number_of_policies(count):
    checks = [check(policy(strategy=STRATEGIES[i % 3], limit=5)) for i in range(count)]
    engine.decide(checks)  # loads the script
    with count_round_trips() as trips:
        for _ in range(20):
            engine.decide(checks)
    assert trips[0] == 20


def test_no_policy_means_no_redis_call():
    with count_round_trips() as trips:
        assert engine.decide([]).allowed
    assert trips[0] == 0


def test_scripts_reload_by_themselves_after_script_flush(redis_client, settings):
    settings.RATELIMIT_REDIS_FUNCTIONS = False  # EVALSHA; FUNCTION FLUSH: tests/test_scripts.py, on a server of its own
    limited = policy(limit=2)
    assert engine.decide([check(limited)]).allowed
    redis_client.script_flush()
    assert engine.decide([check(limited)]).decisions[0].count == 2


def test_keys_are_short_prefixed_and_hide_the_subject(redis_client, settings):
    settings.RATELIMIT_KEY_PREFIX = "site-a"
    limited = policy(limit=2, key="header:X-Api-Key")
    secret = "header:x-api-key=" + "s3cr3t" * 2000
    hit(check(limited, secret), now=T0)
    names = [k.decode() for k in redis_client.keys("*")]
    assert names and all(name.startswith("site-a:") for name in names)
    assert all(len(name) < 64 and "s3cr3t" not in name for name in names)
    counter = next(name for name in names if "{" in name)
    assert counter.count("{") == 1 and counter.index("}") - counter.index("{") == 12  # the 64-bit hash in base64url


# --- memory per subject (MEMORY USAGE) -------------------------------------------------------------


def memory_of_one_counter(redis_client, strategy, **fields):
    limited = policy(strategy=strategy, **fields)
    for i in range(fields.get("limit", 10) * 3):
        hit(check(limited), now=T0 + i * 0.05)
    counter = next(k for k in redis_client.keys("rl:{*"))
    return redis_client.memory_usage(counter, samples=0)


def test_fixed_window_uses_under_100_bytes_per_subject(redis_client):
    assert memory_of_one_counter(redis_client, "fixed_window", limit=1000) < 100


def test_sliding_window_memory_grows_with_buckets_not_requests(redis_client):
    few = memory_of_one_counter(redis_client, "sliding_window", limit=1000, window=60, bucket_size=30)
    redis_client.flushdb()
    many = memory_of_one_counter(redis_client, "sliding_window", limit=1000, window=60, bucket_size=1)
    assert few < 200  # the one bucket, its total and two bucket numbers
    assert many < 150 + 60 * 16  # at most a few bytes per bucket field


def test_sliding_log_memory_is_proportional_to_the_limit(redis_client):
    small = memory_of_one_counter(redis_client, "sliding_log", limit=50)
    redis_client.flushdb()
    large = memory_of_one_counter(redis_client, "sliding_log", limit=500)
    log = next(iter(redis_client.keys("rl:{*")))
    members = redis_client.zcard(log)
    assert large > small * 5  # grows with the limit ...
    # ... by a bounded amount per admitted request: a skiplist node each, about 128 bytes, more or less as
    # Redis draws each node's levels at random (129 bytes a member was seen)
    assert large < members * 160
    assert redis_client.zcount(log, f"({(T0 + 74.95 - 60) * 1000}", "+inf") == 500  # denied requests add nothing
    # what left the window is trimmed once per totals bucket (1 s, 20 requests here), not per request
    assert 500 <= members <= 500 + 20


def test_a_sliding_log_expires_once_its_requests_left_the_window(redis_client):
    limited = policy(strategy="sliding_log", limit=10, window=60)
    hit(check(limited), now=T0)
    [log] = redis_client.keys("rl:{*")
    assert 59_000 < redis_client.pttl(log) <= 61_000  # past the request's window, within a totals bucket (1 s)


@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_window", "sliding_log", "token_bucket"])
def test_the_live_index_and_totals_outlive_every_counter_they_describe(redis_client, strategy):
    """Their expiries move only when a subject's counter empties in a later bucket, not at each busier
    score: still, neither may expire before a counter it lists, nor be left without an expiry."""
    limited = policy(strategy=strategy, limit=100, window=60, **({"bucket_size": 1} if strategy == "sliding_window" else {}))
    for n in range(17):  # new subjects, then counts of 2, 4, 8, 16: index rewrites
        engine.decide([check(limited, "ip:198.51.100.1")])  # on the server's clock, as expiries are
        if n == 3:
            tally.flush()  # the worker writes the index
            redis_client.delete(*redis_client.keys("rl:live:*"))  # an operator's reset meanwhile
    engine.decide([check(limited, "ip:198.51.100.2")])
    tally.flush()
    counters = [redis_client.pttl(key) for key in redis_client.keys("rl:{*")]
    [live] = redis_client.keys("rl:live:*")
    [totals] = redis_client.keys("rl:totals:*")
    assert min(redis_client.pttl(live), redis_client.pttl(totals)) >= max(counters) > 0


# --- exactness under concurrency ---------------------------------------------------------------


def _attempts(compiled, start, results, attempts=100):
    start.wait()
    results.put(sum(engine.decide([check(compiled)]).allowed for _ in range(attempts)))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_eight_processes_hitting_one_subject_admit_exactly_the_limit(strategy):
    limited = policy(strategy=strategy, limit=100, window=3600)
    assert sum(in_processes(_attempts, (limited,))) == 100
    assert engine.decide([check(limited)]).decisions[0].count == 100


# --- server-side work per decision (INFO commandstats, the commands Lua runs included) -----------


@pytest.mark.parametrize(
    "strategy, shape, budget",
    [
        ("fixed_window", {}, {"incrby": 1}),
        ("sliding_window", {"bucket_size": 60}, {"hmget": 1, "hset": 1}),
        ("sliding_log", {}, {"zcount": 2, "zadd": 1}),
        ("token_bucket", {"limit": 10**6}, {"set": 1}),  # within its rate (one request every 3.6 ms)
    ],
)
def test_a_repeat_decision_runs_few_commands_and_leaves_the_live_index_alone(redis_client, strategy, shape, budget):
    """Besides TIME (not called here: `now` is given) a repeat decision runs these commands only: the
    live index, the active count and the version are written or read when their meaning changes
    (a counter that empties in another totals bucket; a version at most every half second), and the
    totals of admitted requests are added by the worker a moment later, not by the decision."""
    from ratelimit_app import policies

    limited = policy(strategy=strategy, **{"limit": 1000, "window": 3600, **shape})
    moments = iter(T0 + 0.01 * i for i in range(100))
    for _ in range(20):  # then counts 21 to 30: no power of two, where the index records a busier subject
        policies.observe_version(hit(check(limited), now=next(moments)).version)  # as the doors do
    tally.flush()
    with tally._flushing:  # the worker's background flush of the totals is no decision's work
        redis_client.config_resetstat()
        for _ in range(10):
            policies.observe_version(hit(check(limited), now=next(moments)).version)
        stats = redis_client.info("commandstats")
    calls = {name[len("cmdstat_"):]: s["calls"] for name, s in stats.items() if not name.startswith(("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_config"))}
    assert calls == {name: 10 * count for name, count in budget.items()}


@pytest.mark.parametrize("strategy, commands", [("fixed_window", 2), ("token_bucket", 3)])
def test_a_refused_repeat_decision_runs_the_call_and_one_read(redis_client, strategy, commands):
    """Without the deny cache every refusal reaches Redis: for a subject refused before, the call and
    one read of its counter (a token bucket's needs TIME too), nothing written (the refusal reaches
    the totals through the worker)."""
    limited = policy(strategy=strategy, limit=1, window=MAX_WINDOW)  # no window ends during the test
    assert [engine.decide([check(limited)]).allowed for _ in range(2)] == [True, False]

    def refused():
        assert not engine.decide([check(limited)]).allowed

    assert server_commands_per_call(redis_client, refused) == commands


def test_a_fixed_windows_repeat_decision_on_the_servers_clock_is_the_call_and_one_incrby(redis_client):
    """Its counter was written with its window's end: one that exists is the current window's, so
    neither TIME nor any other command is needed (as `limits` does it: EVALSHA and INCR)."""
    limited = policy(limit=1000, window=MAX_WINDOW)
    engine.decide([check(limited)])

    def repeat():
        assert engine.decide([check(limited)]).allowed

    stats = {}  # read while the totals' flush is held back: a loaded machine's flush runs right after
    assert server_commands_per_call(redis_client, repeat, stats=stats) == 2
    script = "cmdstat_fcall" if int(redis_client.info("server")["redis_version"].split(".")[0]) >= 7 else "cmdstat_evalsha"
    assert {name for name in stats if not name.startswith(("cmdstat_config", "cmdstat_info"))} == {script, "cmdstat_incrby"}


def test_a_one_second_sliding_window_slides_in_tenths(redis_client):
    limited = policy(strategy="sliding_window", limit=2, window=1)  # no whole-second bucket fits
    assert limited.bucket_ms == 100
    assert [hit(check(limited), now=T0 + 0.05 * i).allowed for i in range(3)] == [True, True, False]
    assert not hit(check(limited), now=T0 + 0.95).allowed  # a fixed window would admit again at T0 + 1.0 ...
    assert hit(check(limited), now=T0 + 1.05).allowed  # ... this one once the first 100 ms left
