"""What one decision sends Redis and gets back: an ordinary request's terms alone, and for one fixed
window the count alone (the worker tells the rest by its clock), read into the same verdicts."""

from __future__ import annotations

import pytest

from ratelimit_app import engine
from ratelimit_app.engine import arguments
from ratelimit_app.engine.scripts import scripts
from tests.helpers import check, policy

T0 = 1_800_000_000.0  # a window boundary (divisible by 60 and 3600)


def sent(checks, **ask):
    call = arguments.Ask(ask.get("now"), ask.get("dry_run", False), ask.get("cost", 1), ask.get("lease", ""))
    return arguments.entry(call), *arguments.script_call(checks, call, False)[:2]


def test_an_ordinary_request_sends_its_policies_terms_alone():
    limited, other = policy(), policy(strategy="sliding_window")
    entry, _, args = sent([check(limited), check(other)])
    assert entry == "decide" and len(args) == 2
    entry, _, args = sent([check(limited)], cost=3)
    assert entry == "decide_with" and args[:3] == ["", "3", ""] and len(args) == 4


def test_a_fixed_windows_repeat_is_answered_with_its_count_alone_and_its_first_with_redis_time(redis_client):
    """A repeat reads no clock: its count alone. The window's first read TIME: the reply tells it, so
    that the worker keeps how far Redis's clock is from its own."""
    limited = policy(limit=2, window=3600)
    assert engine.decide([check(limited)]).allowed  # loads the library
    entry, script_keys, args = sent([check(limited, "ip:192.0.2.9")])
    function = scripts.function(entry)
    replies = [redis_client.execute_command("FCALL", function, 1, *script_keys, *args) for _ in range(3)]
    seconds, micros = redis_client.time()
    (now_ms, *figures), *repeats = replies
    assert figures == [1, -1, -1] and repeats == [2, -3]  # the window's first, a repeat, refused (-1 - 2)
    assert 0 <= int(seconds) * 1000 + int(micros) // 1000 - now_ms < 1000


def test_counts_read_from_a_bare_count_are_those_of_the_full_reply(redis_client):
    """The same requests decided on the server's clock (bare counts) and at a given time (full replies)."""
    on_server, given = policy(limit=2, window=3600), policy(limit=2, window=3600)
    bare = [engine.decide([check(on_server)]).decisions[0] for _ in range(3)]
    full = [engine.decide([check(given)], now=T0 + i).decisions[0] for i in range(3)]
    assert [(d.count, d.remaining, d.exceeded) for d in bare] == [(d.count, d.remaining, d.exceeded) for d in full]
    assert all(0 < d.reset_in <= 3600 for d in bare) and bare[2].retry_after == pytest.approx(bare[2].reset_in)


@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_window", "sliding_log"])
def test_a_limit_beyond_what_the_terms_hold_still_decides(strategy):
    # a limit no database column holds (PostgreSQL's stops at 2**31 - 1): a code policy's, in effect here
    huge = check(policy(strategy=strategy, limit=100, window=60), limit=10**15)
    verdicts = [engine.decide([huge]) for _ in range(3)]
    assert all(v.allowed for v in verdicts)
    assert [v.decisions[0].remaining for v in verdicts][-1] == 10**15 - 3
