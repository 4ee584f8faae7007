"""A step of Redis's clock: the worker follows it from the next reply that carries Redis's time (or its next
heartbeat), and the deny cache then refuses only while Redis itself would.

No test can step a real server's clock; what a step does to a worker is make its last reading of Redis's time
wrong by the step until it reads that time again. The tests make that reading wrong (redis_clock_stepped), then
let the worker meet Redis's real time as it would after a real step."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import engine
from ratelimit_app.engine import keys
from ratelimit_app.engine.server_clock import server_clock
from ratelimit_app.engine.tally import tally
from tests.helpers import check, make_policy, policy
from tests.test_cluster import cluster, shared_cluster  # noqa: F401 - the cluster fixtures

IP = "203.0.113.7"


def heartbeat() -> None:
    """The tally's heartbeat, now: it reads Redis's TIME (a timed reading, the kind a lone reply never overrides)."""
    engine.decide([check(policy(), "ip:192.0.2.250")])  # something for the tally to flush
    tally._heartbeat_due = 0.0
    tally.flush()
    assert server_clock.best_trip_ms is not None


def redis_clock_stepped(seconds: float) -> None:
    """What Redis's clock stepping by `seconds` (back: negative) is to this worker until it reads Redis's time
    again: its last reading now says Redis is that much further on (or behind) than it is."""
    server_clock.offset_ms -= seconds * 1000


def window_left(redis_client, window: float) -> float:
    now_s, micros = redis_client.time()
    return window - (now_s + micros / 1e6) % window


@pytest.fixture
def window(redis_client) -> int:
    """The policies' window: 60 s or a few more, the first whose current window on Redis's clock has 15 s to
    its length less 25 s left, so that a test counts, then steps the clock, with room for the worker's stale
    reading to show and no wait (for a 60 s window to reach that point took up to a minute). Fixed windows
    start where Redis's time is a multiple of theirs, so each length is somewhere else in its window."""
    while True:
        for length in range(60, 90):
            if 15 < window_left(redis_client, length) < length - 25:
                return length
        time.sleep(1)  # (that none fits happens about once in 10^8)


def ttl_s(redis_client, limited, who: str = f"ip:{IP}") -> float:
    return redis_client.pttl(keys.counter_key(limited, check(limited, who).subject.key)) / 1000


def test_after_redis_clock_steps_back_the_next_reply_with_its_time_sets_the_refusals_right(redis_client, window):
    """The review's case: Redis's clock steps back 20 s, 16 s before its 60 s window ends. The worker, which
    read Redis's time before, takes it for 4 s into the next window, and a refusal that it tells by that reading
    (a fixed window's repeat reads no clock) said Retry-After 56 until its next heartbeat, though the reply of
    another subject's request had carried Redis's time meanwhile. Here the step is as long as takes the worker
    4 s into the next window from wherever Redis's window is (16 s before its end: 20 s)."""
    limited = policy(limit=1, window=window)
    heartbeat()
    with tally._flushing:  # no heartbeat meanwhile: only the replies tell the worker Redis's time
        assert engine.decide([check(limited)]).allowed
        stepped_at = _step_across_the_window_end(redis_client, window)
        assert engine.decide([check(policy(), "ip:192.0.2.1")]).allowed  # a window's first: Redis's time comes back
        [refused] = engine.decide([check(limited)]).decisions
    ends_in = ttl_s(redis_client, limited)
    assert stepped_at - 5 < ends_in < stepped_at + 0.1  # (PTTL: whole milliseconds)
    assert not refused.allowed and refused.retry_after <= ends_in + 1, (refused.retry_after, ends_in)  # was 56


def _hit(ip: str = IP):
    return ratelimit_app.hit(RequestFactory().get("/", REMOTE_ADDR=ip), "export")


def _step_across_the_window_end(redis_client, window: int) -> float:
    """Step Redis's clock back so far that the worker takes it for 4 s into the next window (whatever time it is):
    Redis's window ends in e seconds (3 to its length less 10), the worker then tells the length less 4 (56 s
    of a 60 s window). Returns e."""
    ends_in = window_left(redis_client, window)
    assert 3 < ends_in < window - 10, ends_in  # the window fixture left room for what the test did before
    redis_clock_stepped(-(ends_in + 4))
    return ends_in


@pytest.mark.django_db
@pytest.mark.parametrize("told_by", ["reply", "heartbeat"])
def test_a_refusal_remembered_before_the_worker_learns_of_a_step_is_not_kept_past_redis_window(
    redis_client, told_by, window
):
    """Redis's clock steps back, and a refusal told by the worker's stale reading (56 s) is remembered. Once the
    worker learns Redis's time again (a reply that carries it, or the heartbeat), the deny cache refused on for
    the 56 s it remembered: up to 40 s after Redis's window had ended and Redis admitted the subject again."""
    make_policy(name="export", action="export", limit=1, window=window, key="ip")
    heartbeat()
    with tally._flushing:
        assert _hit().allowed
        ends_in = _step_across_the_window_end(redis_client, window)
        refused = _hit()
        assert not refused.allowed and refused.decisions[0].retry_after > ends_in + 5  # the stale reading's
        assert _hit().decisions[0].retry_after > ends_in + 5  # from memory
        if told_by == "reply":
            assert _hit("198.51.100.9").allowed  # another subject's first request: its reply carries Redis's time
    if told_by == "heartbeat":
        stale = server_clock.offset_ms
        tally._heartbeat_due = 0.0
        tally.flush()
        for _ in range(50):  # a reading whose round trip was slow (a loaded machine) is discarded: the next beat's
            if server_clock.offset_ms != stale:
                break
            tally._heartbeat_due = 0.0
            tally._heartbeat()
    again = _hit()
    assert not again.allowed  # Redis's window has not ended yet: refused still
    assert again.decisions[0].retry_after <= ends_in + 1, (again.decisions[0].retry_after, ends_in)  # was ~56


def test_after_redis_clock_steps_forward_the_next_reply_with_its_time_sets_the_refusals_right(redis_client, window):
    """Forward: the worker takes Redis for 20 s behind itself, and told a fixed window's refusal 20 s too long."""
    limited = policy(limit=1, window=window)
    heartbeat()
    assert 3 < window_left(redis_client, window) < window - 22  # the window fixture's: 20 s more is still in it
    with tally._flushing:
        assert engine.decide([check(limited)]).allowed
        redis_clock_stepped(20)
        assert engine.decide([check(policy(), "ip:192.0.2.1")]).allowed
        [refused] = engine.decide([check(limited)]).decisions
    ends_in = ttl_s(redis_client, limited)
    assert not refused.allowed and refused.retry_after <= ends_in + 1, (refused.retry_after, ends_in)


def test_a_reply_read_late_does_not_move_the_workers_reading(redis_client):
    """Guard: a reply's time moves the worker's reading only when it could not have been read with it (the call
    was sent after, or read before, the time it carries), never by the delay of one reply."""
    heartbeat()
    before = server_clock.offset_ms
    sent = time.monotonic() - 2  # a call sent 2 s ago whose reply is read only now
    server_clock.seen(int(before + (sent + 1) * 1000), sent)  # Redis ran it 1 s after it was sent
    assert server_clock.offset_ms == before


@pytest.mark.parametrize("through", ["async", "cluster"])
def test_a_step_back_shows_through_the_async_client_and_on_a_cluster(redis_client, through, request):
    """The same as the review's case, through redis-py's asyncio client, and on Redis Cluster (a pipeline to
    each master): each reply says when its call was sent, which a step back needs to show."""
    if through == "cluster":
        request.getfixturevalue("cluster")
    window = request.getfixturevalue("window")  # once the cluster is up: its start takes seconds of the window
    limited = policy(limit=1, window=window)
    heartbeat()

    def decide(*checks):
        if through == "async":
            return asyncio.run(engine.adecide(list(checks)))
        return engine.decide(list(checks))

    with tally._flushing:
        assert decide(check(limited)).allowed
        ends_in = _step_across_the_window_end(redis_client, window)
        assert decide(check(policy(), "ip:192.0.2.1")).allowed  # a window's first: Redis's time comes back
        [refused] = decide(check(limited)).decisions
    assert not refused.allowed and refused.retry_after <= ends_in + 1, (refused.retry_after, ends_in)  # was 56
