"""The operator's side of Redis: what the live page and the policy list read, and resets.

Kept apart from the request path (engine.py): these reads serve people watching, never requests.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple, Sequence

from . import keys
from .connection import breaker, client
from .scripts import now_arg, scripts

if TYPE_CHECKING:
    from .policies import CompiledPolicy


class SubjectUsage(NamedTuple):
    key: str
    display: str
    count: int
    reset_in: float
    limit: int  # the limit in effect for this subject (a token bucket: its burst, what the count is compared with)
    overridden: bool  # an override gave this subject a limit other than the policy's


class LiveUsage(NamedTuple):
    allowed: int
    denied: int
    subjects: list[SubjectUsage]  # active in the current window, in no particular order


def live_usage(policy: CompiledPolicy, *, now: float | None = None) -> LiveUsage:
    """Totals of the current window and every subject active in it, read in one call."""
    head, tail = keys.counter_key_parts(policy)
    args = [now_arg(now), policy.strategy, policy.limit, policy.window_ms, policy.bucket_ms, head, tail]
    redis_client = client()
    script = scripts.get("live", redis_client)
    reply = breaker.call(lambda: script([keys.live_key(policy), keys.totals_key(policy)], args, redis_client))
    subjects: dict[str, SubjectUsage] = {}
    for i in range(3, len(reply), 3):  # oldest first: a subject seen again under a new limit keeps the newest
        member, count, reset_ms = reply[i : i + 3]
        subject_key, limit, overridden, display = parse_live_member(member.decode())
        capacity = policy.capacity(limit or policy.limit)
        subjects[subject_key] = SubjectUsage(subject_key, display, count, reset_ms / 1000, capacity, overridden)
    return LiveUsage(reply[1], reply[2], list(subjects.values()))


def parse_live_member(member: str) -> tuple[str, int, bool, str]:
    """The parts of a live index entry written by engine.live_member: key, limit, overridden, display."""
    subject_key, limit, display = (member.split(" ", 2) + ["", ""])[:3]
    return subject_key, int(limit.rstrip("*") or 0), limit.endswith("*"), display


def reset_subjects(policy: CompiledPolicy, subject_keys: Sequence[str]) -> int:
    """Forget the counts of these subjects under this policy; returns how many counters existed."""
    if not subject_keys:
        return 0
    redis_client = client()
    live_key = keys.live_key(policy)

    def reset() -> int:
        wanted = set(subject_keys)
        members = [m for m in redis_client.zrange(live_key, 0, -1) if m.decode().partition(" ")[0] in wanted]
        with redis_client.pipeline() as pipe:
            pipe.delete(*(keys.counter_key(policy, key) for key in subject_keys))
            if members:
                pipe.zrem(live_key, *members)
            return pipe.execute()[0]

    return breaker.call(reset)


class PolicyActivity(NamedTuple):
    active: int  # subjects seen in the current window
    allowed: int  # requests counted in the current window
    denied: int  # requests denied (shadow: that would have been) in the current window


def policy_activity(policies: Sequence) -> dict[int, PolicyActivity]:
    """Activity of many policies (rows or compiled) in their current window, in one round trip."""
    if not policies:
        return {}
    redis_client = client()
    now_ms = int(time.time() * 1000)

    def read() -> list:
        with redis_client.pipeline(transaction=False) as pipe:
            for policy in policies:
                window_ms = policy.window * 1000
                pipe.zcount(keys.live_key(policy), f"({now_ms - window_ms}", "+inf")
                pipe.hmget(f"{keys.totals_key(policy)}:{now_ms // window_ms}", "a", "d")
            return pipe.execute()

    replies = breaker.call(read)
    return {
        policy.id: PolicyActivity(replies[2 * i], int(replies[2 * i + 1][0] or 0), int(replies[2 * i + 1][1] or 0))
        for i, policy in enumerate(policies)
    }


# --- trends: allowed and denied per window, from the per-window totals the decide script keeps ----

TREND_SECONDS = 3600  # the totals of a window must be kept at least this long for the trend to exist
TREND_MAX_WINDOWS = 60


class TrendPoint(NamedTuple):
    start: int  # when the window began, seconds since the epoch
    allowed: int
    denied: int  # for a shadow policy: what it would have denied


def trend_windows(window: int) -> int:
    """How many windows a trend shows: the last 60, or the last hour if that is fewer (at least 2)."""
    return max(2, min(TREND_MAX_WINDOWS, TREND_SECONDS // window))


def policy_trend(policy: CompiledPolicy, windows: int | None = None, *, now: float | None = None) -> list[TrendPoint]:
    """Allowed and denied in each of the policy's last `windows` windows (the current one last)."""
    return policy_trends([policy], windows, now=now)[policy.id]


def policy_trends(policies: Sequence, windows: int | None = None, *, now: float | None = None) -> dict[int, list[TrendPoint]]:
    """The trends of many policies (rows or compiled), in one pipelined round trip of HMGETs."""
    if not policies:
        return {}
    now_ms = int((time.time() if now is None else now) * 1000)
    spans = []
    for policy in policies:
        if not policy.window or policy.window < 1:
            continue  # a bad row that reached the database: it counts nothing, so it has no trend
        window_ms = policy.window * 1000
        current = now_ms // window_ms
        count = windows or trend_windows(policy.window)
        spans.append((policy, window_ms, range(current - count + 1, current + 1)))
    redis_client = client()

    def read() -> list:
        with redis_client.pipeline(transaction=False) as pipe:
            for policy, _, numbers in spans:
                totals = keys.totals_key(policy)
                for number in numbers:
                    pipe.hmget(f"{totals}:{number}", "a", "d")
            return pipe.execute()

    replies = iter(breaker.call(read))
    trends: dict[int, list[TrendPoint]] = {policy.id: [] for policy in policies}
    for policy, window_ms, numbers in spans:
        trends[policy.id] = [
            TrendPoint(number * window_ms // 1000, int(allowed or 0), int(denied or 0))
            for number, (allowed, denied) in zip(numbers, replies)
        ]
    return trends
