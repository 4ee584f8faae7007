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


def window_ends_in(redis_client, seconds: float, window: float = 60) -> None:
    """Wait until Redis's `window`-second window ends in `seconds` (so that a step lands where it shows)."""
    now_s, micros = redis_client.time()
    ends_in = window - (now_s + micros / 1e6) % window
    time.sleep((ends_in - seconds) % window)


def window_left(redis_client, window: float = 60) -> float:
    now_s, micros = redis_client.time()
    return window - (now_s + micros / 1e6) % window


def ttl_s(redis_client, limited, who: str = f"ip:{IP}") -> float:
    return redis_client.pttl(keys.counter_key(limited, check(limited, who).subject.key)) / 1000


def test_after_redis_clock_steps_back_the_next_reply_with_its_time_sets_the_refusals_right(redis_client):
    """The review's figures: Redis's clock steps back 20 s, 16 s before its 60 s window ends. The worker, which
    read Redis's time before, takes it for 4 s into the next window, and a refusal that it tells by that reading
    (a fixed window's repeat reads no clock) said Retry-After 56 until its next heartbeat, though the reply of
    another subject's request had carried Redis's time meanwhile."""
    limited = policy(limit=1, window=60)
    heartbeat()
    window_ends_in(redis_client, 16.5)
    with tally._flushing:  # no heartbeat meanwhile: only the replies tell the worker Redis's time
        assert engine.decide([check(limited)]).allowed
        redis_clock_stepped(-20)
        assert engine.decide([check(policy(), "ip:192.0.2.1")]).allowed  # a window's first: Redis's time comes back
        [refused] = engine.decide([check(limited)]).decisions
    ends_in = ttl_s(redis_client, limited)
    assert 15 < ends_in <= 17
    assert not refused.allowed and refused.retry_after <= ends_in + 1, (refused.retry_after, ends_in)  # was 56


def _hit(ip: str = IP):
    return ratelimit_app.hit(RequestFactory().get("/", REMOTE_ADDR=ip), "export")


@pytest.fixture(autouse=True)
def inside_a_window(redis_client):
    """Each test counts first and steps the clock after: it starts where Redis's window has 15 to 50 s left, so
    that no wait between the two crosses into the next window (its first count would be gone)."""
    if not 15 < window_left(redis_client) < 50:
        window_ends_in(redis_client, 45)


def _step_across_the_window_end(redis_client) -> float:
    """Step Redis's clock back so far that the worker takes it for 4 s into the next window (whatever time it is):
    Redis's window ends in e seconds (3 to 50), the worker then tells 56. Returns e."""
    ends_in = window_left(redis_client)
    assert 3 < ends_in < 50, ends_in  # inside_a_window left room for what the test did before
    redis_clock_stepped(-(ends_in + 4))
    return ends_in


@pytest.mark.django_db
@pytest.mark.parametrize("told_by", ["reply", "heartbeat"])
def test_a_refusal_remembered_before_the_worker_learns_of_a_step_is_not_kept_past_redis_window(
    redis_client, told_by
):
    """Redis's clock steps back, and a refusal told by the worker's stale reading (56 s) is remembered. Once the
    worker learns Redis's time again (a reply that carries it, or the heartbeat), the deny cache refused on for
    the 56 s it remembered: up to 40 s after Redis's window had ended and Redis admitted the subject again."""
    make_policy(name="export", action="export", limit=1, window=60, key="ip")
    heartbeat()
    with tally._flushing:
        assert _hit().allowed
        ends_in = _step_across_the_window_end(redis_client)
        refused = _hit()
        assert not refused.allowed and refused.decisions[0].retry_after > ends_in + 5  # the stale reading's
        assert _hit().decisions[0].retry_after > ends_in + 5  # from memory
        if told_by == "reply":
            assert _hit("198.51.100.9").allowed  # another subject's first request: its reply carries Redis's time
    if told_by == "heartbeat":
        tally._heartbeat_due = 0.0
        tally.flush()
    again = _hit()
    assert not again.allowed  # Redis's window has not ended yet: refused still
    assert again.decisions[0].retry_after <= ends_in + 1, (again.decisions[0].retry_after, ends_in)  # was ~56


def test_after_redis_clock_steps_forward_the_next_reply_with_its_time_sets_the_refusals_right(redis_client):
    """Forward: the worker takes Redis for 20 s behind itself, and told a fixed window's refusal 20 s too long."""
    limited = policy(limit=1, window=60)
    heartbeat()
    if not 3 < window_left(redis_client) < 38:
        window_ends_in(redis_client, 30)
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
    limited = policy(limit=1, window=60)
    heartbeat()

    def decide(*checks):
        if through == "async":
            return asyncio.run(engine.adecide(list(checks)))
        return engine.decide(list(checks))

    with tally._flushing:
        assert decide(check(limited)).allowed
        ends_in = _step_across_the_window_end(redis_client)
        assert decide(check(policy(), "ip:192.0.2.1")).allowed  # a window's first: Redis's time comes back
        [refused] = decide(check(limited)).decisions
    assert not refused.allowed and refused.retry_after <= ends_in + 1, (refused.retry_after, ends_in)  # was 56
