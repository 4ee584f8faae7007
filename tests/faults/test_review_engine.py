"""Engine v3's Redis side attacked as a hostile reviewer would, twice: a fixed window's repeat that reads no
clock (the worker tells its reset by Redis's time as it last measured it), a reply read late, a host clock
stepped, old libraries and prune (ACL users, odd keys, other sites' prefixes). Real servers only; the
worker's time.time is moved, never Redis's."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
import redis
from django.contrib.auth.models import AnonymousUser
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import engine, live, operations
from ratelimit_app.engine import keys
from ratelimit_app.engine.scripts import HEARTBEAT_MS, library_key, scripts
from ratelimit_app.engine.server_clock import ServerClock
from ratelimit_app.engine.tally import tally
from ratelimit_app.values import Subject
from tests.helpers import check, make_policy, move_worker_clock, policy
from tests.relay import Relay
from tests.test_cluster import cluster, shared_cluster  # noqa: F401 - the cluster fixtures
from tests.test_prune import libraries, load_version


@pytest.fixture
def worker_clock_off_by(monkeypatch):
    """Move the worker's clock `seconds` further from Redis's (calls add up: a drift, then an NTP step)."""
    return lambda seconds: move_worker_clock(monkeypatch, seconds)


def _request(ip: str = "203.0.113.7"):
    made = RequestFactory().get("/search/", REMOTE_ADDR=ip)
    made.user = AnonymousUser()
    return made


def _pttl_s(redis_client, limited, who: str = "ip:203.0.113.7") -> float:
    return redis_client.pttl(keys.counter_key(limited, check(limited, who).subject.key)) / 1000


# --- 1. a fixed window's figures told by the worker's clock ----------------------------------------------


@pytest.mark.parametrize("skew", [-600, 600], ids=["worker-behind", "worker-ahead"])
def test_a_fixed_window_refusal_tells_when_redis_ends_the_window_whatever_the_workers_clock(
    redis_client, worker_clock_off_by, skew
):
    """A worker whose clock is 10 minutes off Redis's tells Retry-After and the reset (`t`) of an hour's window
    by its own clock, since the repeat's reply carries no time (verdicts.py:18-22, :41-45): up to 10 min too early
    (the client comes back and is refused again) or up to 50 min too late (and the deny cache refuses it locally
    that long after Redis's window ended). Fix: let a refusal, and every first request, which reads TIME anyway,
    return the server's now (or the counter's PTTL), and keep the worker's offset from it."""
    worker_clock_off_by(skew)
    limited = policy(limit=1, window=3600)
    assert engine.decide([check(limited)]).allowed
    [refused] = engine.decide([check(limited)]).decisions
    assert not refused.allowed
    ends_in = _pttl_s(redis_client, limited)  # when Redis's window, and its counter, end
    assert abs(refused.retry_after - ends_in) <= 2, (refused.retry_after, ends_in)
    assert abs(refused.reset_in - ends_in) <= 2, (refused.reset_in, ends_in)


def test_a_worker_whose_first_decisions_read_no_clock_tells_redis_window_after_its_first_flush(
    redis_client, worker_clock_off_by
):
    """A fresh worker whose first decisions are repeats (another worker started the window) hears no time
    from Redis in their replies: the tally's first flush reads Redis's TIME beside its heartbeat, and the
    worker tells Redis's window from then on."""
    limited = policy(limit=2, window=3600)
    assert engine.decide([check(limited)]).allowed  # the window's first, on a clock as Redis's
    worker_clock_off_by(600)
    tally._heartbeat_due = 0.0  # a fresh worker's: its first flush reads the clock
    assert engine.decide([check(limited)]).allowed  # a repeat: no time in its reply
    tally.flush()
    [refused] = engine.decide([check(limited)]).decisions
    ends_in = _pttl_s(redis_client, limited)
    assert not refused.allowed and abs(refused.retry_after - ends_in) <= 2, (refused.retry_after, ends_in)


def _redis_ms(redis_client) -> int:
    seconds, micros = redis_client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.django_db
def test_the_deny_cache_never_refuses_a_subject_after_redis_started_its_next_window(redis_client, worker_clock_off_by):
    """A worker whose clock is a little ahead of Redis's (here under two seconds) remembers a fixed window's
    refusal until the end of *its* window, and keeps answering 429 from memory after Redis's window ended and
    its counter expired: the subject is locked out for up to a window (verdicts.py:41-45 feeding
    deny_cache.py:86). Fix: as above; the deny cache must not outlive the counter Redis refused with."""
    window_ms = 6000
    make_policy(name="search", action="search", limit=1, window=window_ms // 1000)
    left = window_ms - _redis_ms(redis_client) % window_ms
    if left > 1500:  # start late in one of Redis's windows
        time.sleep((left - 1000) / 1000)
        left = window_ms - _redis_ms(redis_client) % window_ms
    worker_clock_off_by(left / 1000 + 0.3)  # the worker reads its window as just begun
    assert ratelimit_app.hit(_request(), "search").allowed
    assert not ratelimit_app.hit(_request(), "search").allowed
    [counter] = redis_client.keys(f"{keys.prefix()}:{{*")
    while redis_client.exists(counter):  # Redis's window ends: its counter goes with it
        time.sleep(0.05)
    time.sleep(0.5)  # the worker hears Redis's time a trip late: its refusals may outlast the window by that
    assert ratelimit_app.hit(_request(), "search").allowed  # was refused from the deny cache, for ~5 s more


@pytest.mark.django_db
def test_the_live_page_lists_a_subject_counted_by_a_worker_whose_clock_is_behind(worker_clock_off_by):
    """The tally scores a subject's live index entry, and files its totals, by the worker's clock when the reply
    carries none (verdicts.py:18-22 -> tally.py _fold); the live page reads them by Redis's. A worker 5 minutes
    behind makes a subject counted and refused in a 1-minute window vanish from the live page and its totals
    (entries 'ended' 4 minutes ago). Fix: the reply's now (or an offset learnt from Redis's TIME) for the tally."""
    row = make_policy(name="search", action="search", limit=2, window=60)
    worker_clock_off_by(-300)
    assert [ratelimit_app.hit(_request(), "search").allowed for _ in range(3)] == [True, True, False]
    tally.flush()
    data, _ = operations.live_snapshot(row)
    assert [(entry["count"], entry["blocked"]) for entry in data["subjects"]] == [(2, True)]
    assert data["totals"] == {"allowed": 2, "denied": 1}


# --- 4. prune -----------------------------------------------------------------------------------------


def _prune() -> str:
    out = StringIO()
    call_command("ratelimit", "prune", stdout=out)
    return out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize("denied", ["-function", "-function|delete", "-scan"],
                         ids=["no-function", "no-function-delete", "no-scan"])
def test_prune_as_a_user_without_function_permission_says_so(settings, private, denied):
    """`manage.py ratelimit prune` as an ACL user that may not run FUNCTION: without FUNCTION LIST it prints
    "No library of this app on the server" and succeeds (libraries.py:45-47: NOPERM read as a server without
    Functions, scripts.py:100), though the server holds them; without FUNCTION DELETE it says "Redis is
    unreachable" (libraries.py:55-57 -> ratelimit.py:148-149). Fix: tell a NOPERM apart and raise
    CommandError("the Redis user may not run FUNCTION LIST/DELETE ...")."""
    admin = redis.Redis(port=private.port)
    admin.execute_command("FUNCTION LOAD", scripts.library.replace(scripts.library_name, "ratelimit_000000000001"))
    admin.acl_setuser("pruner", enabled=True, passwords=["+pruner-secret"], keys=["*"], commands=["+@all", denied])
    settings.CACHES = {**settings.CACHES, "limits": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": private.url,
        "OPTIONS": {"USERNAME": "pruner", "PASSWORD": "pruner-secret"}}}
    settings.RATELIMIT_CACHE = "limits"
    try:
        with pytest.raises(CommandError) as refused:
            _prune()
        assert "permission" in str(refused.value).lower() and "unreachable" not in str(refused.value)
        assert any(entry[1] == b"ratelimit_000000000001" for entry in admin.execute_command("FUNCTION LIST"))
    finally:
        admin.close()


@pytest.mark.slow
@pytest.mark.django_db
def test_prune_on_a_cluster_deletes_an_unused_library_from_every_master_and_keeps_one_in_use(cluster):  # noqa: F811
    """Guard: prune goes to every master of a cluster (a library is loaded per master), and reads each
    library's word (a key in some slot) through the cluster client."""
    for master in cluster.masters:
        for name in ("ratelimit_000000000001", "ratelimit_000000000002"):
            master.client.execute_command("FUNCTION LOAD", scripts.library.replace(scripts.library_name, name))
    engine.client().set(library_key("ratelimit_000000000002"), "1", px=HEARTBEAT_MS)
    output = _prune()
    assert "Deleted ratelimit_000000000001" in output and "Kept ratelimit_000000000002" in output
    for master in cluster.masters:
        names = {entry[1] for entry in master.client.function_list()}
        assert "ratelimit_000000000001" not in names and "ratelimit_000000000002" in names


@pytest.mark.django_db
def test_a_site_whose_redis_user_may_only_touch_its_key_prefix_counts_its_first_request(settings, private):
    """Sites sharing one Redis (RATELIMIT_KEY_PREFIX) often log in as users confined to their prefix (`~rl:*`).
    The library's word that a worker runs it is written outside any prefix (scripts.py:252,
    'ratelimit-library:<name>'), right after FUNCTION LOAD inside the decision (scripts.py:134): NOPERM
    fails the decision that loaded the library (the request passes uncounted), and every heartbeat after,
    so prune deletes libraries in use. Fix: put the word under the key prefix (prune scans the prefixes it
    knows), and never let the heartbeat's failure fail the decision that loaded the library."""
    admin = redis.Redis(port=private.port)
    admin.acl_setuser("site", enabled=True, passwords=["+site-secret"], keys=[f"{keys.prefix()}:*"],
                      commands=["+@all"])
    settings.CACHES = {**settings.CACHES, "limits": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": private.url,
        "OPTIONS": {"USERNAME": "site", "PASSWORD": "site-secret"}}}
    settings.RATELIMIT_CACHE = "limits"
    make_policy(name="search", action="search", limit=5, window=3600)
    try:
        counts = [[d.count for d in ratelimit_app.hit(_request(), "search").decisions] for _ in range(3)]
        assert counts == [[1], [2], [3]]  # was [[], [1], [2]]: the first passed uncounted (logged: NOPERM)
    finally:
        admin.close()


# --- 1-2. a counter never outlives its window, all-or-nothing --------------------------------------------


@pytest.mark.parametrize("cost", [1, 3])
def test_a_window_counter_given_back_by_a_refusal_still_ends_with_redis_window(redis_client, cost):
    """Guard: a window's first request counted then given back (another policy refused) leaves a counter
    of 0 units; the next request, which INCRBY finds at `cost` again, is read as the window's first and
    written with its expiry: no counter without one, none outliving Redis's window."""
    counted, full = policy(limit=5 * cost, window=3600), policy(limit=cost, window=3600, key="user")
    assert engine.decide([check(full)], cost=cost).allowed
    assert not engine.decide([check(counted), check(full)], cost=cost).allowed
    assert engine.decide([check(counted)], dry_run=True).decisions[0].count == 0
    assert [engine.decide([check(counted)], cost=cost).decisions[0].count for _ in range(2)] == [cost, 2 * cost]
    seconds, micros = redis_client.time()
    ends_in = 3600 - (int(seconds) % 3600 + int(micros) / 1e6)
    assert 0 < _pttl_s(redis_client, counted) <= ends_in + 0.01


# --- the offset from Redis's clock (the second review) --------------------------------------------------


def test_one_reply_read_late_does_not_move_every_refusal_of_the_next_seconds(private, settings):
    """A window's first reply read 2 s after Redis ran the script (a GC pause, a starved thread, a TCP
    retransmit) teaches the worker that Redis is 2 s behind it: until the next heartbeat (10 s) every
    refusal says Retry-After 2 s too long, and the deny cache refuses the subject 2 s after Redis's window
    ended (verdicts.py:23-24 -> server_clock.py:24-26 takes any one-way reading, however late). Fix: keep
    only readings whose round trip is short (time the call; NTP's least-delay filter), never one reply's."""
    with Relay(private.port) as relay:
        own = {**settings.CACHES["default"], "LOCATION": relay.url}
        own["OPTIONS"] = {**own.get("OPTIONS", {}), "SOCKET_TIMEOUT": 5}  # the reply comes, late
        settings.CACHES = {**settings.CACHES, "own": own}
        settings.RATELIMIT_CACHE = "own"
        assert engine.decide([check(policy(), "ip:192.0.2.1")]).allowed  # connected, the library loaded
        tally._heartbeat_due = 0.0
        tally.flush()  # the heartbeat just read Redis's TIME: the next is 10 s away
        limited = policy(limit=1, window=3600)
        first = []
        with tally._flushing:
            relay.hold_answers()
            try:
                deciding = threading.Thread(target=lambda: first.append(engine.decide([check(limited)])))
                deciding.start()
                time.sleep(2)  # Redis ran the script (and read TIME) at once; its answer waits
            finally:
                relay.release_answers()
            deciding.join()
            assert first and first[0].allowed
            [refused] = engine.decide([check(limited)]).decisions  # a repeat: told by the offset
        assert not refused.allowed
        ends_in = _pttl_s(redis.Redis(port=private.port), limited)
        assert abs(refused.retry_after - ends_in) <= 0.5, (refused.retry_after, ends_in)  # was ~2 s more


def test_a_heartbeat_reading_of_redis_time_whose_trip_was_slow_is_not_taken(private):
    """A TIME answered late (held 0.3 s here) would move every later reset by half the delay: once a
    reading with a short trip exists, one slower than STEADY_TRIP_MS and than twice the best is dropped."""
    clock = ServerClock()
    direct = redis.Redis(port=private.port)
    clock.read(direct)
    offset, best = clock.offset_ms, clock.best_trip_ms
    with Relay(private.port) as relay:
        relayed = redis.Redis(port=relay.port, socket_timeout=5)
        relayed.ping()  # connected: only TIME's answer waits
        relay.hold_answers()
        try:
            reading = threading.Thread(target=clock.read, args=(relayed,))
            reading.start()
            time.sleep(0.3)  # Redis answered at once; the relay holds it
        finally:
            relay.release_answers()
        reading.join()
        relayed.close()
    direct.close()
    assert (clock.offset_ms, clock.best_trip_ms) == (offset, best)


def test_a_worker_whose_host_clock_is_stepped_back_tells_redis_window_at_once(redis_client, worker_clock_off_by):
    """A worker 10 min ahead learns the offset from Redis's replies; NTP then steps its host clock back to
    the true time. The offset, kept against the wall clock, is now 10 min off: every refusal until the next
    reading says Retry-After and the reset 10 min off (before this change: exact), and the deny cache keeps
    such a refusal 10 min past Redis's window (server_clock.py:20-26 adds a wall-clock offset). Fix: keep
    Redis's time against time.monotonic() (which no step moves), not against time.time()."""
    worker_clock_off_by(600)
    limited = policy(limit=1, window=3600)
    with tally._flushing:  # no heartbeat between: a step lands between two readings
        assert engine.decide([check(limited)]).allowed  # the window's first: its reply teaches the offset
        worker_clock_off_by(-600)  # the host clock is stepped back to the true time
        [refused] = engine.decide([check(limited)]).decisions
    ends_in = _pttl_s(redis_client, limited)
    assert not refused.allowed and abs(refused.retry_after - ends_in) <= 2, (refused.retry_after, ends_in)


def test_a_call_given_its_time_never_teaches_the_offset(redis_client):
    """Guard: a test's `now` (an hour ahead) comes back in its reply; the worker keeps Redis's offset, and a
    repeat's refusal tells Redis's window."""
    limited = policy(limit=1, window=3600)
    with tally._flushing:
        assert engine.decide([check(limited)]).allowed  # the window's first: Redis's time
        assert engine.decide([check(policy(limit=5), "ip:192.0.2.9")], now=time.time() + 3000).allowed
        [refused] = engine.decide([check(limited)]).decisions
    ends_in = _pttl_s(redis_client, limited)
    assert not refused.allowed and abs(refused.retry_after - ends_in) <= 2, (refused.retry_after, ends_in)


# zones of every whole hour and the odd ones: one has just passed midnight, whatever the hour now
ZONES = [f"Etc/GMT{n:+d}" for n in range(-14, 13)] + [
    "Asia/Kolkata", "Asia/Kathmandu", "Asia/Tehran", "Asia/Kabul", "Asia/Yangon", "Australia/Eucla",
    "Australia/Darwin", "Pacific/Marquesas", "Pacific/Chatham", "America/St_Johns"]


def _zone_just_past_midnight(redis_client) -> tuple[str, float]:
    """The zone whose day began last by Redis's clock, and the seconds since."""
    seconds, micros = redis_client.time()
    now = int(seconds) + int(micros) / 1e6
    since = {}
    for name in ZONES:
        local = datetime.fromtimestamp(now, ZoneInfo(name))
        since[name] = (local - local.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds()
    name = min(since, key=since.get)
    return name, since[name]


@pytest.mark.django_db
def test_a_quota_reset_just_after_midnight_by_a_worker_whose_clock_is_behind_holds(redis_client, worker_clock_off_by):
    """A subject's daily quota reset from the live page (or `ratelimit reset`) minutes after midnight, by a worker
    whose clock is still before it, is undone: the reset writes yesterday's emptied counter expiring at
    yesterday's end, already past for Redis, the counter is gone and the next request takes back the usage
    saved for today (live/resets.py:55 and operations.py:33 read time.time(), not server_clock). Fix: the
    resets read Redis's clock (server_clock.now_ms(), or TIME on the admin's connection)."""
    zone_name, since_midnight = _zone_just_past_midnight(redis_client)
    limited = policy(strategy="calendar_quota", period="day", time_zone=zone_name, window=1, limit=10)
    worker_clock_off_by(-(since_midnight + 5))  # the worker's day is still yesterday
    who = check(limited)
    assert [engine.decide([who]).decisions[0].count for _ in range(3)] == [1, 2, 3]  # today's, by Redis
    live.reset_subjects(limited, [who.subject.key])
    assert engine.decide([who]).decisions[0].count == 1, zone_name  # was 4: the reset undone


# --- prune and the library words (the second review) ---------------------------------------------------


@pytest.fixture
def own_server(settings, private):
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": private.url}}
    settings.RATELIMIT_CACHE = "own"
    return private


@pytest.mark.django_db
def test_prune_is_not_stopped_by_a_key_of_another_app_that_is_not_utf8(own_server):
    """Another app on the same Redis holds a binary key (a hash, msgpack) that happens to contain
    'library:ratelimit_': prune's SCAN returns it and `key.decode()` raises UnicodeDecodeError, a traceback
    instead of a prune (libraries.py:39). Fix: match the words as bytes (or decode with errors='replace'),
    and only keys of a word's shape: '<...>:library:ratelimit_<12 hex>' with a TTL of at most HEARTBEAT_MS."""
    assert engine.decide([check(policy())]).allowed
    load_version("ratelimit_000000000001")
    engine.client().set(b"\xfe\xffother-app:library:ratelimit_\xff", b"1")
    output = _prune()
    assert "Deleted ratelimit_000000000001" in output
    assert libraries() == {scripts.library_name}


@pytest.mark.django_db
def test_a_subject_text_naming_an_old_library_never_keeps_it(own_server):
    """Guard: a custom subject whose key a client chose ('...library:ratelimit_<old>') makes a counter key that
    prune's SCAN matches, but the key goes on after the text ('}:<policy>:<shape>'): it names no library, and
    the unused one is deleted."""
    assert engine.decide([check(policy())]).allowed
    load_version("ratelimit_000000000001")
    chosen = Subject("x:library:ratelimit_000000000001", "chosen")
    limited = policy()
    assert engine.decide([engine.Check(limited, chosen, limited.limit)]).allowed
    assert engine.client().keys("*library:ratelimit_000000000001*")  # the SCAN finds it
    output = _prune()
    assert "Deleted ratelimit_000000000001" in output
    assert libraries() == {scripts.library_name}


@pytest.mark.django_db
@pytest.mark.parametrize("prefix", ["site[1]*?", "library:ratelimit_site"], ids=["glob", "the-pattern's-text"])
def test_prune_keeps_a_library_whose_site_prefix_holds_glob_characters_or_the_pattern(own_server, settings, prefix):
    """Guard: a site's prefix with glob characters, or with the pattern's own text, still says it runs its
    library, and prune (from a site of the default prefix) finds the word and keeps the library."""
    assert engine.decide([check(policy())]).allowed
    load_version("ratelimit_000000000001")
    load_version("ratelimit_000000000002")
    engine.client().set(f"{prefix}:library:ratelimit_000000000002", "1", px=HEARTBEAT_MS)
    settings.RATELIMIT_KEY_PREFIX = prefix
    assert engine.decide([check(policy())]).allowed  # this site's counters share the prefix
    settings.RATELIMIT_KEY_PREFIX = "rl"
    output = _prune()
    assert "Deleted ratelimit_000000000001" in output and "Kept ratelimit_000000000002" in output
    assert libraries() == {scripts.library_name, "ratelimit_000000000002"}


@pytest.mark.django_db
def test_a_site_confined_to_its_prefix_says_it_runs_its_library(settings, private):
    """Guard: a user confined to `~rl:*` loads the library, its heartbeat (with its TIME) writes the word
    under the prefix, and an admin's prune keeps the library."""
    admin = redis.Redis(port=private.port)
    admin.acl_setuser("site", enabled=True, passwords=["+site-secret"], keys=[f"{keys.prefix()}:*"], commands=["+@all"])
    admin.execute_command("FUNCTION LOAD", scripts.library.replace(scripts.library_name, "ratelimit_000000000001"))
    settings.CACHES = {**settings.CACHES, "limits": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": private.url,
        "OPTIONS": {"USERNAME": "site", "PASSWORD": "site-secret"}}}
    settings.RATELIMIT_CACHE = "limits"
    try:
        assert engine.decide([check(policy())]).decisions[0].count == 1
        admin.delete(library_key(scripts.library_name))  # the word a load wrote lapsed
        tally._heartbeat_due = 0.0
        tally.flush()
        assert admin.pttl(library_key(scripts.library_name)) > 0
        output = _prune()  # as the confined user: SCAN and FUNCTION are not key commands
        assert f"Kept {scripts.library_name}" in output and "Deleted ratelimit_000000000001" in output
    finally:
        admin.close()
