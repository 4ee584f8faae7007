"""Review of the lean tally (a decision hands a precomputed key, the flush sums keys) and of the
header items kept per (policy snapshot, limit, window): what a user reads (the totals, each bucket's
field, the headers) against what the decisions said, on real servers (one, shards, a cluster), across
totals buckets, refusals, token buckets, an edit, a refused flush, a fork and the async path."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from django.http import HttpResponse

from ratelimit_app import engine, headers, live
from ratelimit_app.engine.tally import tally
from ratelimit_app.engine import Check
from tests.helpers import check, in_threads, policy, repeated_meanwhile, subject

pytestmark = pytest.mark.slow

T0 = 1_800_000_000.0  # a time of Redis's clock handed to each decision (buckets crossed on purpose)


def _expected(verdict, want: dict) -> None:
    """What the totals must say of one verdict: a policy over its limit refused; the others counted only
    when no enforcing policy denied."""
    for decision in verdict.decisions:
        totals = want.setdefault(decision.policy, [0, 0])
        if decision.exceeded:
            totals[1] += 1
        elif verdict.allowed:
            totals[0] += 1


def _run(policies, subjects: int, steps: int, step_s: float, want: dict, decide=engine.decide) -> float:
    now = T0
    for i in range(steps):
        who = f"ip:198.51.100.{i % subjects}"
        verdict = decide([check(p, who) for p in policies], now=now)
        _expected(verdict, want)
        if i % 17 == 0:
            tally.flush()  # flushes fall mid-run, between a subject's repeat keys
        now += step_s
    return now


@pytest.mark.parametrize("strategy", ["sliding_window", "token_bucket", "fixed_window", "sliding_log"])
def test_totals_exact_across_policies_buckets_and_refusals(strategy):
    # three policies of a request, refusals by one while the others admit, several totals buckets crossed
    extra = {"burst": 3} if strategy == "token_bucket" else {}
    tight = policy(strategy=strategy, limit=4, window=60, **extra)
    roomy = policy(strategy="sliding_window", limit=10**6, window=60)
    shadow = policy(strategy="fixed_window", limit=6, window=60, mode="shadow")
    want: dict = {}
    now = _run([tight, roomy, shadow], subjects=3, steps=300, step_s=0.05, want=want)
    for compiled, (allowed, denied) in want.items():
        got = live.policy_totals(compiled, now=now)[:2]
        assert got == (allowed, denied), f"{compiled.strategy} {compiled.mode}: {got} for {(allowed, denied)}"
    assert want[tight][1] > 0 and want[roomy][0] > 0  # refusals and admissions both happened


def test_totals_exact_when_decisions_race_the_flush():
    # threads note while flushes fold: a key added between a flush's slice and its delete must count once
    limited = policy(strategy="sliding_window", limit=10**6, window=60)

    def work():
        for i in range(400):
            assert engine.decide([check(limited, f"ip:192.0.2.{i % 5}")], now=T0 + i * 0.01).allowed

    with repeated_meanwhile(tally.flush):
        assert in_threads(work, threads=4)[1] == []
    assert live.policy_totals(limited, now=T0 + 5)[:2] == (1600, 0)


def test_async_totals_match_sync():
    # async path parity: the same decisions counted the same
    a = policy(strategy="sliding_window", limit=4, window=60)
    b = policy(strategy="token_bucket", limit=4, window=60, burst=2)
    want: dict = {}

    async def run():
        now = T0
        for i in range(120):
            verdict = await engine.adecide([check(a, f"ip:203.0.113.{i % 3}"), check(b, f"ip:203.0.113.{i % 3}")],
                                           now=now)
            _expected(verdict, want)
            now += 0.1
        return now

    now = asyncio.run(run())
    for compiled, (allowed, denied) in want.items():
        assert live.policy_totals(compiled, now=now)[:2] == (allowed, denied)


def _set_by_django(decisions) -> dict:
    """The headers as Django's own setter stores the values apply() makes."""
    response = HttpResponse()
    headers.apply(response, decisions)
    return dict(response.items())


@pytest.mark.parametrize("name", ["café-search", "搜索", "plain-name", 'quote"and\\slash', "tab\there"])
def test_header_values_are_what_django_would_store(name):
    # the fast path stores without the setter only what the setter would store unchanged
    # names are slugs (validated); a snapshot renamed past validation tests apply() itself
    compiled = replace(policy(limit=5, window=60), name=name)
    verdict = engine.decide([check(compiled)])
    response = HttpResponse()
    headers.apply(response, verdict.decisions)
    by_setter = HttpResponse()
    for header in ("RateLimit-Policy", "RateLimit"):
        by_setter.headers[header] = response.headers[header]
    assert dict(response.items()) == dict(by_setter.items())
    # what reaches the wire is latin-1 encodable (WSGI), as Django makes it
    for value in response.headers.values():
        value.encode("latin-1")


def test_header_of_a_name_with_a_line_break_never_splits_the_response():
    compiled = replace(policy(limit=5, window=60), name="evil\r\nSet-Cookie: a=b")
    decision = engine.decide([check(compiled)]).decisions
    response = HttpResponse()
    try:
        headers.apply(response, decision)
    except Exception as error:  # Django's BadHeaderError: the name never reaches the wire as is
        assert "newline" in str(error).lower()
        return
    for value in response.headers.values():
        assert "\r" not in value and "\n" not in value


def test_header_per_subject_limit_is_not_shared():
    # an override or a plan gives one subject another limit under the same policy snapshot
    compiled = policy(limit=10, window=60)
    small = engine.decide([Check(compiled, subject("ip:192.0.2.1"), 2)]).decisions
    large = engine.decide([Check(compiled, subject("ip:192.0.2.2"), 1000)]).decisions
    assert ";q=2;" in _set_by_django(small)["RateLimit-Policy"]
    assert ";q=1000;" in _set_by_django(large)["RateLimit-Policy"]
    assert ";q=2;" in _set_by_django(small)["RateLimit-Policy"]


def test_header_of_an_edited_policy_says_its_new_name_and_limit():
    # a policy edited in the admin (same id) is a new snapshot: its headers must not keep the old figures
    first = policy(name="before", limit=5, window=60)
    _set_by_django(engine.decide([check(first)]).decisions)
    edited = replace(first, name="after", limit=7)
    values = _set_by_django(engine.decide([check(edited, "ip:192.0.2.77")]).decisions)
    assert values["RateLimit-Policy"].startswith('"after";q=7;')
    assert values["RateLimit"].startswith('"after";')


def test_totals_exact_after_a_refused_flush_past_the_notes_bound(server):
    # notes past MOST_NOTED folded by requests while the flusher is held, then a flush Redis refuses (down),
    # then Redis back: each decision counted once, refusals and buckets included
    from project.devredis import PrivateRedis
    from ratelimit_app.engine.tally import MOST_NOTED

    tight = policy(strategy="sliding_window", limit=3, window=60)
    roomy = policy(strategy="fixed_window", limit=10**6, window=60)
    want: dict = {}
    with tally._flushing:
        now = T0
        for i in range(MOST_NOTED + 500):
            verdict = engine.decide([check(roomy, f"ip:198.51.100.{i % 7}"), check(tight, f"ip:198.51.100.{i % 7}")],
                                    now=now)
            _expected(verdict, want)
            now += 0.004
        server.stop()
    tally.flush()  # refused: kept for later
    back = PrivateRedis(port=server.port).start()
    try:
        for compiled, totals in want.items():
            assert live.policy_totals(compiled, now=now)[:2] == tuple(totals)
    finally:
        back.stop()


def _decide_five_and_exit(limited, start, results):
    start.wait()
    results.put(sum(engine.decide([check(limited, f"ip:192.0.2.{i}")], now=T0 + 1).allowed for i in range(5)))


def test_a_forked_worker_never_sends_its_parents_pending_counts():
    limited = policy(strategy="sliding_window", limit=100, window=60)
    from tests.helpers import in_processes

    with tally._flushing:  # the parent's counts wait, noted and not folded, as the workers fork
        for i in range(5):
            engine.decide([check(limited, f"ip:203.0.113.{i}")], now=T0)
        admitted = sum(in_processes(_decide_five_and_exit, (limited,), processes=3))
    assert admitted == 15
    assert live.policy_totals(limited, now=T0 + 2)[:2] == (20, 0)


@pytest.mark.parametrize("shards", [2, 5])
def test_totals_exact_over_shards(settings, shards):
    # subjects spread over shards: each shard's keys (one per policy, series and bucket) summed apart
    settings.RATELIMIT_SHARDS = shards
    tight = policy(strategy="token_bucket", limit=4, window=60, burst=2)
    roomy = policy(strategy="sliding_window", limit=10**6, window=60)
    want: dict = {}
    now = _run([tight, roomy], subjects=11, steps=400, step_s=0.02, want=want)
    for compiled, (allowed, denied) in want.items():
        assert live.policy_totals(compiled, now=now)[:2] == (allowed, denied)
    assert want[tight][1] > 0


def test_totals_exact_when_a_policy_is_edited_mid_run():
    # an admin edit (same id, another limit) makes a new snapshot: the old one's pending keys and the new
    # one's reach the same totals, each request once, in one flush
    before = policy(strategy="sliding_window", limit=3, window=60)
    after = replace(before, limit=5)
    want: dict = {}
    with tally._flushing:  # both snapshots' keys wait for one flush
        now = T0
        for i in range(40):
            verdict = engine.decide([check(before if i < 20 else after, f"ip:198.51.100.{i % 2}")], now=now)
            _expected(verdict, want)
            now += 0.1
    allowed = sum(totals[0] for totals in want.values())
    denied = sum(totals[1] for totals in want.values())
    assert live.policy_totals(after, now=now)[:2] == (allowed, denied)
    assert denied > 0


@pytest.fixture(scope="module")
def lean_cluster():
    from tests.cluster import LocalCluster

    started = LocalCluster()
    yield started
    started.stop()


def test_totals_exact_on_a_cluster(lean_cluster, settings):
    # a real cluster of 3 masters: a request's policies across slots, refusals, buckets crossed
    from tests.test_cluster import use

    lean_cluster.flush()
    use(lean_cluster, settings)
    tight = policy(strategy="token_bucket", limit=4, window=60, burst=2)
    roomy = policy(strategy="sliding_window", limit=10**6, window=60)
    want: dict = {}
    now = _run([tight, roomy], subjects=13, steps=300, step_s=0.02, want=want)
    for compiled, (allowed, denied) in want.items():
        assert live.policy_totals(compiled, now=now)[:2] == (allowed, denied)
    assert want[tight][1] > 0


@pytest.mark.parametrize("strategy", ["sliding_window", "token_bucket"])
def test_each_count_lands_in_its_own_totals_bucket(redis_client, strategy):
    # a key made once a totals bucket must move on at the boundary: the trend and the window's edge read
    # each bucket's field, so a count left in an older bucket leaves the totals early
    from ratelimit_app.engine import keys

    extra = {"burst": 2} if strategy == "token_bucket" else {}
    tight = policy(strategy=strategy, limit=3, window=60, **extra)
    roomy = policy(strategy=strategy, limit=10**6, window=60, **({"burst": 10**6} if extra else {}))
    want: dict = {tight: {}, roomy: {}}
    now = T0
    for i in range(300):
        for compiled in (tight, roomy):  # apart: a refusal by one does not hide the other's counts
            verdict = engine.decide([check(compiled, f"ip:198.51.100.{i % 3}")], now=now)
            series = "d" if verdict.decisions[0].exceeded else "a"
            field = f"{series}{int(now * 1000) // compiled.totals_bucket_ms}"
            want[compiled][field] = want[compiled].get(field, 0) + 1
        if i % 23 == 0:
            tally.flush()
        now += 0.05  # 15 s: several buckets, within one window (nothing rolled up yet)
    tally.flush()
    for compiled, fields in want.items():
        stored = {k.decode(): int(v) for k, v in redis_client.hgetall(keys.totals_key(compiled, 0)).items()
                  if k[:1] in (b"a", b"d") and k[1:].isdigit()}
        assert stored == fields
        assert len(fields) > 5
    assert any(field.startswith("d") for field in want[tight])
