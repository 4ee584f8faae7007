"""The token bucket (GCRA): a burst at once, then a steady rate; exact, window-free, one integer per subject."""

from __future__ import annotations


import pytest
from django.http import HttpResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.measure import server_commands
from ratelimit_app import engine, headers
from ratelimit_app.engine import arguments, keys
from ratelimit_app.models import Override, Policy
from ratelimit_app.policies import compile_policy
from ratelimit_app.rates import MAX_WINDOW
from tests.helpers import check, in_processes, make_policy, policy, server_commands_per_call, subject

T0 = 1_800_000_000.0  # a window boundary for every window used here


def hit(*checks, now, dry_run=False, cost=1):
    return engine.decide(list(checks), now=now, dry_run=dry_run, cost=cost)


def bucket(**fields):
    return policy(strategy="token_bucket", **fields)


# --- a reference model ---------------------------------------------------------------------------


def _ms_up(microseconds: int) -> int:
    return -(-microseconds // 1000)


class ReferenceBucket:
    """GCRA as the README states it, in virtual-scheduling form: a request at `now` passes iff
    TAT - tau <= now, tau = T * (burst - 1), T = window / limit in whole microseconds rounded up;
    an admitted request moves TAT to max(TAT, now) + T; a denied one changes nothing."""

    def __init__(self) -> None:
        self.tat = 0  # microseconds; in the past means a full bucket

    def request(self, now_ms: int, limit: int, window: int, burst: int, cost: int = 1) -> dict:
        """A request of `cost` tokens: it passes iff TAT + (cost - 1) * T - tau <= now, and moves TAT by cost * T."""
        interval = -(-window * 1_000_000 // limit)
        tolerance = interval * (burst - 1)
        now = now_ms * 1000
        tat = max(self.tat, now)
        allowed = cost <= burst and tat + (cost - 1) * interval - tolerance <= now
        if allowed:
            tat = self.tat = tat + cost * interval
        # how many more tokens may be taken at this same moment
        remaining = max((now + tolerance - tat) // interval + 1, 0)
        return {
            "allowed": allowed,
            "remaining": remaining,
            "reset_ms": _ms_up(tat - now),
            "retry_ms": None if allowed or cost > burst else _ms_up(tat + (cost - 1) * interval - tolerance - now),
        }


def observed(verdict) -> dict:
    [decision] = verdict.decisions
    return {
        "allowed": decision.allowed,
        "remaining": decision.remaining,
        "reset_ms": round(decision.reset_in * 1000),
        "retry_ms": None if decision.retry_after is None else round(decision.retry_after * 1000),
    }


_pks = iter(range(500_000, 10**9))

steps = st.lists(
    st.tuples(
        st.one_of(st.just(0), st.integers(1, 50), st.integers(51, 20_000)),  # ms since the previous request
        st.sampled_from([1, 2, 3, 7, 10, 100]),  # the limit in effect (an override may change it)
        st.sampled_from([None, 1, 2, 5, 10]),  # the policy's burst, edited between requests (the limit in effect caps it)
        st.sampled_from([1, 1, 1, 2, 3, 11]),  # the request's cost (11: above every burst, never fits)
    ),
    min_size=1,
    max_size=60,
)


def seen_as(checked, seen: int | None) -> None:
    """Make the worker send `seen` (what it saw at the subject's last decision) with the next decision
    of this check; None leaves what the worker really saw."""
    if seen is not None:
        parts = arguments.check_parts(checked.policy, checked.subject, checked.limit, "", keys.prefix(), keys.shards())
        parts[4] = seen


# Who the property tests decide for: three subjects in lockstep, one whose worker sends what it saw,
# one whose worker always says it saw nothing, one that always says it saw units counted (a token
# bucket then moves its TAT with INCRBY first): the hint picks commands, never the outcome.
HINTS = {"ip:198.51.100.1": None, "ip:198.51.100.2": arguments.SEEN_NOTHING, "ip:198.51.100.3": arguments.SEEN_COUNTED}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(window=st.sampled_from([1, 6, 60]), steps=steps)
def test_decisions_match_the_reference_model(window, steps):
    pk, now_ms = next(_pks), int(T0 * 1000)
    models = {who: ReferenceBucket() for who in HINTS}
    compiled = {}  # one policy (same id, same counters) whose burst the operator edits
    for advance, limit, burst, cost in steps:
        now_ms += advance
        if burst not in compiled:
            compiled[burst] = bucket(pk=pk, limit=10, window=window, burst=burst)
        for who, seen in HINTS.items():
            checked = check(compiled[burst], who=who, limit=limit)
            seen_as(checked, seen)
            verdict = engine.decide([checked], now=now_ms / 1000, cost=cost)
            expected = models[who].request(now_ms, limit, window, min(burst or limit, limit), cost)
            assert observed(verdict) == expected, (who, advance, limit, burst, cost)


# --- the behaviour users read about -----------------------------------------------------------------


def test_a_burst_passes_at_once_then_one_request_every_window_over_limit():
    limited = bucket(limit=10, window=60)  # burst blank: 10 at once, then 1 every 6 s
    first = [hit(check(limited), now=T0) for _ in range(11)]
    assert [v.allowed for v in first] == [True] * 10 + [False]
    assert [v.decisions[0].remaining for v in first] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0]
    assert first[-1].decisions[0].retry_after == pytest.approx(6)
    assert not hit(check(limited), now=T0 + 5.999).allowed
    assert [hit(check(limited), now=T0 + 6).allowed for _ in range(2)] == [True, False]
    assert [hit(check(limited), now=T0 + 12).allowed for _ in range(2)] == [True, False]


def test_a_burst_below_the_limit_spreads_the_limit_over_the_window():
    limited = bucket(limit=100, window=60, burst=5)  # 5 at once, then one every 0.6 s
    assert [hit(check(limited), now=T0).allowed for _ in range(6)] == [True] * 5 + [False]
    assert hit(check(limited), now=T0 + 0.6).allowed
    assert not hit(check(limited), now=T0 + 0.6).allowed
    over_a_minute = sum(hit(check(limited), now=T0 + 0.6 + ms / 1000).allowed for ms in range(100, 60_100, 100))
    assert over_a_minute == 100  # the sustained rate is the limit per window


def test_denied_requests_are_not_counted():
    limited = bucket(limit=3, window=60)
    for _ in range(3):
        hit(check(limited), now=T0)
    for i in range(200):  # a client that keeps hammering for 19.9 s
        hit(check(limited), now=T0 + i * 0.1)
    assert hit(check(limited), now=T0 + 20).allowed  # one request every 20 s, however many were refused
    assert not hit(check(limited), now=T0 + 20).allowed


def test_what_redis_holds_decides_whatever_the_engine_wrote_last(redis_client):
    """The TAT a decision wrote last is only a guess at the next one: a counter deleted (a reset, an
    expiry) or set to another TAT behind the engine's back is what counts, whichever way it moved."""
    limited = bucket(limit=100, window=60, burst=5)  # 5 at once, then one every 0.6 s
    counter = keys.counter_key(limited, subject().key)

    def taken(count, cost=1):
        return [hit(check(limited), now=T0, cost=cost).allowed for _ in range(count)]

    assert taken(2) == [True] * 2
    two_in_use = redis_client.get(counter)
    assert taken(4) == [True] * 3 + [False]
    five_in_use = redis_client.get(counter)
    redis_client.set(counter, two_in_use)  # the engine wrote a full bucket: Redis has room for 3
    assert taken(4) == [True] * 3 + [False]
    redis_client.delete(counter)
    assert taken(1) == [True]
    redis_client.set(counter, two_in_use)  # the engine wrote 1 in use: Redis has 2
    assert taken(4) == [True] * 3 + [False]
    redis_client.delete(counter)
    assert taken(1) == [True]
    redis_client.set(counter, five_in_use)  # the engine wrote 1 in use: Redis has no room
    assert taken(1) == [False]
    assert redis_client.get(counter) == five_in_use  # the refusal left it as it was
    redis_client.delete(counter)  # the engine wrote (and read) a full bucket: Redis has an empty one
    assert taken(1, cost=5) == [True]


def test_a_full_bucket_is_reported_empty_and_forgotten_by_redis(redis_client):
    limited = bucket(limit=10, window=60)
    for _ in range(3):
        hit(check(limited), now=T0)
    later = hit(check(limited), now=T0 + 9, dry_run=True).decisions[0]
    assert (later.count, later.remaining, later.reset_in) == (2, 8, pytest.approx(9))  # 1.5 used: still 2 in use
    assert hit(check(limited), now=T0 + 18, dry_run=True).decisions[0].remaining == 10
    [counter] = redis_client.keys("rl:{*")
    # forgotten one to two fill times (60 s) after the bucket is full (at 18 s): at the end of the next
    # whole fill time, so that a subject within its rate finds its last TAT and its live index entry
    # stays put, and a burst moved by INCRBY within its fill time never outlives its key
    assert 18_000 + 59_000 < redis_client.pttl(counter) <= 18_000 + 2 * 60_000


def test_no_doubling_across_a_window_edge_unlike_a_fixed_window():
    fixed = policy(strategy="fixed_window", limit=10, window=60)
    smooth = bucket(limit=10, window=60)
    admitted = {"fixed": 0, "token_bucket": 0}
    for second in (T0 + 59.5, T0 + 60.5):  # ten requests just before the fixed edge, ten just after
        for _ in range(10):
            admitted["fixed"] += hit(check(fixed), now=second).allowed
            admitted["token_bucket"] += hit(check(smooth), now=second).allowed
    assert admitted == {"fixed": 20, "token_bucket": 10}


def test_in_any_span_at_most_the_burst_plus_the_rate_pass():
    limited = bucket(limit=10, window=60, burst=4)
    times = [T0 + i * 0.25 for i in range(4 * 600)]  # ten minutes of four attempts a second
    admitted = [now for now in times if hit(check(limited), now=now).allowed]
    for start in admitted:  # every 60 s span beginning at an admission: the burst, then one per 6 s
        assert sum(start <= t < start + 60 for t in admitted) <= 4 + 10


def test_an_override_changes_the_rate_and_a_blank_burst_follows_the_limit():
    blank = bucket(limit=2, window=60)
    assert [hit(check(blank, limit=5), now=T0).allowed for _ in range(6)] == [True] * 5 + [False]
    assert hit(check(blank, limit=5), now=T0).decisions[0].retry_after == pytest.approx(12)


def test_an_override_keeps_an_explicit_burst_up_to_its_own_limit():
    limited = bucket(limit=4, window=120, burst=3)  # 3 at once, then one every 30 s
    raised = [hit(check(limited, "ip:198.51.100.1", limit=60), now=T0) for _ in range(4)]
    assert [v.allowed for v in raised] == [True] * 3 + [False]
    assert raised[-1].decisions[0].retry_after == pytest.approx(2)  # one every 2 s at the overridden rate
    lowered = [hit(check(limited, "ip:198.51.100.2", limit=1), now=T0) for _ in range(2)]
    assert [v.allowed for v in lowered] == [True, False]  # a burst never exceeds the limit in effect
    assert lowered[-1].decisions[0].retry_after == pytest.approx(120)


def test_shadow_token_bucket_reports_but_never_denies():
    shadow = bucket(limit=1, window=60, mode="shadow")
    verdicts = [hit(check(shadow), now=T0) for _ in range(3)]
    assert all(v.allowed for v in verdicts)
    assert [v.decisions[0].exceeded for v in verdicts] == [False, True, True]


def test_all_or_nothing_with_other_strategies():
    tight = bucket(limit=1, window=60)
    loose = policy(strategy="fixed_window", limit=10)
    assert hit(check(tight), check(loose), now=T0).allowed
    denied = hit(check(tight), check(loose), now=T0 + 1)
    assert [d.policy.id for d in denied.denied_by] == [tight.id]
    assert denied.decisions[1].count == 1  # the fixed window did not count the refused request


# --- budgets: memory and server-side commands -------------------------------------------------------


@pytest.mark.parametrize("pk", [7, 123456])  # a site's six-digit policy ids too
def test_one_integer_of_at_most_80_bytes_per_subject(redis_client, pk):
    limited = bucket(limit=1000, window=3600, burst=100, pk=pk)
    for i in range(300):
        hit(check(limited), now=T0 + i * 0.05)
    [counter] = redis_client.keys("rl:{*")
    assert redis_client.object("encoding", counter) == b"int"
    assert redis_client.memory_usage(counter, samples=0) <= 80


def test_no_more_server_commands_than_the_fixed_window(redis_client):
    def commands_per_decision(compiled):
        moments = iter(T0 + 0.01 * i for i in range(21))  # one request every 10 ms
        from ratelimit_app.engine.tally import tally

        engine.decide([check(compiled)], now=next(moments))  # loads the script, creates the subject's live entry
        tally.flush()
        with tally._flushing:  # the worker's background writes are not the decisions' (a loaded machine times them in)
            redis_client.config_resetstat()
            before = server_commands(redis_client)
            for moment in moments:
                engine.decide([check(compiled)], now=moment)
            return (server_commands(redis_client) - before) / 20

    fixed = commands_per_decision(policy(strategy="fixed_window", limit=10**6, window=3600))
    smooth = commands_per_decision(bucket(limit=10**6, window=3600))  # one every 3.6 ms: within its rate
    assert smooth <= fixed
    stats = redis_client.info("commandstats")  # of the token bucket's 20 decisions: one SET each
    assert stats["cmdstat_set"]["calls"] == 20 and "cmdstat_get" not in stats


def test_a_decision_within_its_rate_or_using_its_burst_runs_three_commands(redis_client):
    """A subject within its rate (its bucket full again at each request): the call, TIME and one SET
    ... GET. A subject spending its burst (each request moves the TAT further ahead of now): the call,
    TIME and one INCRBY, because the worker saw it spending its burst at its last decision."""
    steady = bucket(limit=10**6, window=1)  # one request every microsecond: full again at every request
    spending = bucket(limit=10**6, window=MAX_WINDOW, burst=1000)  # one request per 31.6 s sustained
    for _ in range(20):
        engine.decide([check(spending)])
    engine.decide([check(steady)])

    def spend():
        assert engine.decide([check(spending)]).allowed

    def within_rate():
        assert engine.decide([check(steady)]).allowed

    assert server_commands_per_call(redis_client, within_rate) == 3
    stats = {}
    spent = server_commands_per_call(redis_client, spend, stats=stats) * 10  # its 10 calls
    # and a PEXPIRE when the TAT enters the next fill time (31,622 s here: at most once in 10 calls)
    pexpires = stats.get("cmdstat_pexpire", {}).get("calls", 0)
    assert pexpires <= 1 and spent - pexpires == 30


def test_a_burst_moved_by_incrby_keeps_its_key_alive_past_its_tat(redis_client):
    """INCRBY keeps a key's expiry: the key must still outlive the TAT it moves, or the bucket would
    read full again early. Every TAT a burst of 30 reaches is checked against the key's life."""
    spending = bucket(limit=10, window=60, burst=10)  # one request every 6 s, 10 at once
    now = T0
    for _ in range(30):
        verdict = hit(check(spending), now=now)
        [counter] = redis_client.keys("rl:{*")
        tat_ms = int(redis_client.get(counter)) / 1000 - now * 1000  # the TAT, ms ahead of now
        assert redis_client.pttl(counter) > tat_ms, verdict.decisions[0]
        now += 1.5 if verdict.allowed else 6  # faster than the rate: the burst stays in use
    assert redis_client.info("commandstats").get("cmdstat_pexpire", {}).get("calls", 0) >= 1


# --- exactness under concurrency ----------------------------------------------------------------


def _attempts(compiled, start, results, attempts=100):
    start.wait()
    results.put(sum(engine.decide([check(compiled)]).allowed for _ in range(attempts)))


def test_eight_processes_hitting_one_subject_admit_exactly_the_burst():
    limited = bucket(limit=100, window=3600, burst=100)  # the next request fits 36 s later
    assert sum(in_processes(_attempts, (limited,))) == 100
    assert engine.decide([check(limited)], dry_run=True).decisions[0].remaining == 0


# --- headers ----------------------------------------------------------------------------------------


def header_response(verdict):
    response = HttpResponse()
    headers.apply(response, verdict.decisions, verdict.denied_by)
    return response.headers


def test_headers_say_the_burst_what_may_be_made_now_and_when_the_bucket_is_full():
    limited = bucket(limit=20, window=120, burst=10, name="bursty")  # 10 at once, then one every 6 s
    for _ in range(3):
        hit(check(limited), now=T0)
    sent = header_response(hit(check(limited), now=T0 + 1))
    assert sent["RateLimit-Policy"] == '"bursty";q=10;w=60'  # 10 at once, all back within 60 s
    assert sent["RateLimit"] == '"bursty";r=6;t=23'  # 4 of 10 in use, the bucket full at T0 + 24
    assert "Retry-After" not in sent
    blank = bucket(limit=10, window=60, name="api-bucket")  # the README's example: burst blank = the limit
    sent = [header_response(hit(check(blank), now=T0)) for _ in range(3)][-1]
    assert (sent["RateLimit-Policy"], sent["RateLimit"]) == ('"api-bucket";q=10;w=60', '"api-bucket";r=7;t=18')


def test_retry_after_is_when_one_more_request_fits_never_earlier():
    limited = bucket(limit=3, window=10, name="three-per-10s")  # one every 3.334 s
    for _ in range(3):
        hit(check(limited), now=T0)
    denied = hit(check(limited), now=T0 + 0.5)
    sent = header_response(denied)
    retry = denied.decisions[0].retry_after
    assert retry == pytest.approx(2.834)
    assert sent["Retry-After"] == "3"
    assert sent["RateLimit"] == '"three-per-10s";r=0;t=3'
    assert not hit(check(limited), now=T0 + 0.5 + retry - 0.001).allowed
    assert hit(check(limited), now=T0 + 0.5 + retry).allowed


@pytest.mark.django_db
def test_a_real_request_gets_the_token_bucket_headers_and_429(client):
    make_policy(name="search-bucket", action="demo:search", strategy="token_bucket", limit=4, window=24, burst=2)
    answers = [client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].headers["RateLimit-Policy"] == '"search-bucket";q=2;w=12'
    assert answers[0].headers["RateLimit"] in ('"search-bucket";r=1;t=6', '"search-bucket";r=1;t=5')
    assert answers[2].headers["Retry-After"] in ("6", "5")  # the next request fits 6 s after the first
    assert int(answers[2].headers["Retry-After"]) >= 1


# --- the admin: form, validation, live page, reset ----------------------------------------------


CHANGELIST = "/admin/ratelimit_app/policy/"
FORM = {
    "name": "search-bucket", "action": "demo:search", "limit": "60", "window": "60", "strategy": "token_bucket",
    "key": "ip", "methods": "", "mode": "enforce", "enabled": "on", "bucket_size": "", "burst": "20",
    "description": "", "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0",
    "overrides-MIN_NUM_FORMS": "0", "overrides-MAX_NUM_FORMS": "1000",
}


@pytest.mark.django_db
def test_the_admin_form_creates_a_token_bucket_and_explains_the_burst(admin_client):
    page = admin_client.get(CHANGELIST + "add/").content.decode()
    assert 'name="burst"' in page and "burst 10, then 1 request every 6 s" in page
    assert admin_client.post(CHANGELIST + "add/", FORM).status_code == 302
    assert Policy.objects.get(name="search-bucket").burst == 20


@pytest.mark.django_db
@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"strategy": "fixed_window"}, "burst", "The burst applies to token_bucket only"),
        ({"burst": "0"}, "burst", "at least 1 request"),
        ({"limit": "1", "window": "6", "burst": "10"}, "burst", "write a limit of 10 per 60 s"),
        ({"limit": "3", "window": "10", "burst": "5"}, "burst", "write a limit of 6 per 20 s"),
        ({"limit": "1", "window": "31622400", "burst": "2"}, "burst", "at most the limit (1)"),
        ({"limit": "2000000", "window": "1", "burst": ""}, "limit", "at most 1,000,000 requests per second"),
    ],
)
def test_bad_token_bucket_values_are_refused_with_a_message(admin_client, changes, field, message):
    response = admin_client.post(CHANGELIST + "add/", {**FORM, **changes})
    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors[field])
    assert not Policy.objects.filter(name=FORM["name"]).exists()  # the refused form wrote nothing


@pytest.mark.django_db
def test_live_page_shows_what_may_be_made_now_and_when_the_bucket_is_full(admin_client, client):
    row = make_policy(name="search-bucket", action="demo:search", strategy="token_bucket", limit=6, window=60, burst=3)
    Override.objects.create(policy=row, kind="ip", network="198.51.100.2", limit=60, reason="partner")
    for ip, times in (("198.51.100.1", 4), ("198.51.100.2", 2)):
        for _ in range(times):
            client.get("/demo/search/?q=a", REMOTE_ADDR=ip)
    live_url = f"{CHANGELIST}{row.pk}/live/"
    assert "6 / 1 min, burst 3" in admin_client.get(live_url).content.decode()
    data = admin_client.get(live_url + "?format=json").json()
    shown = {s["subject"]: s for s in data["subjects"]}
    busy, partner = shown["ip:198.51.100.1"], shown["ip:198.51.100.2"]
    assert (busy["count"], busy["limit"], busy["remaining"], busy["blocked"]) == (3, 3, 0, True)
    assert 20 < busy["reset_in"] <= 30  # three requests of 10 s each
    assert (partner["count"], partner["remaining"], partner["blocked"], partner["overridden"]) == (2, 1, False, True)
    assert 0 < partner["reset_in"] <= 2  # one a second at the partner's rate
    assert data["totals"] == {"allowed": 5, "denied": 1}
    admin_client.post(f"{live_url}reset/", {"subject": busy["key"]})
    assert client.get("/demo/search/?q=a", REMOTE_ADDR="198.51.100.1").status_code == 200
    assert compile_policy(Policy.objects.get(pk=row.pk)).burst == 3
