"""What a policy's totals say: allowed, denied and active in its window (the live page's summary and
the policy list's columns), and per window over the last hour (the trend)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

from django.core.exceptions import ValidationError

from .. import engine
from ..engine import admin_call, admin_client, now_arg, run_each
from ..loading import compile_policy

if TYPE_CHECKING:
    from ..values import CompiledPolicy


def policy_totals(policy: CompiledPolicy, *, now: float | None = None) -> tuple[int, int, int, int]:
    """(allowed, denied, active subjects, now in ms by the server's clock) of the policy's window,
    summed over its shards (a subject lives in one shard)."""
    engine.tally.flush()  # what this process counted counts too
    script = engine.scripts.get("totals", admin_client())
    args = [now_arg(now), policy.window_ms, policy.totals_bucket_ms]
    calls = [([engine.totals_key(policy, shard)], args) for shard in range(engine.shard_count())]
    replies = admin_call(lambda client: run_each(client, script, calls))
    allowed, denied, active = (sum(reply[i] for reply in replies) for i in (1, 2, 3))
    return allowed, denied, active, replies[0][0]


# --- the policy list ----------------------------------------------------------------------------


class PolicyActivity(NamedTuple):
    active: int  # subjects active in the policy's window
    allowed: int  # requests counted in that window
    denied: int  # requests denied (shadow: that would have been) in that window


def policy_activity(policies: Sequence) -> dict[int, PolicyActivity | None]:
    """Activity of many policy rows in their window, one short script each, sent together; None
    for a row that fails validation (it is not enforced)."""
    engine.tally.flush()  # what this process counted counts too
    compiled: list[CompiledPolicy] = []
    activity: dict[int, PolicyActivity | None] = {}
    for row in policies:
        try:
            compiled.append(compile_policy(row))
        except (ValidationError, ValueError, KeyError):
            activity[row.pk] = None
    if not compiled:
        return activity
    script = engine.scripts.get("totals", admin_client())
    shards = engine.shard_count()
    calls = [
        ([engine.totals_key(policy, shard)], ["", policy.window_ms, policy.totals_bucket_ms])
        for policy in compiled
        for shard in range(shards)
    ]
    replies = admin_call(lambda client: run_each(client, script, calls))
    for i, policy in enumerate(compiled):  # each policy's shards, summed
        own = replies[i * shards : (i + 1) * shards]
        activity[policy.id] = PolicyActivity(*(sum(reply[at] for reply in own) for at in (3, 1, 2)))
    return activity


# --- trends: allowed and denied per window over the last hour, from the policy's totals -----------

TREND_SECONDS = 3600
TREND_MAX_WINDOWS = 60


class TrendPoint(NamedTuple):
    start: int  # when the window began, seconds since the epoch
    allowed: int
    denied: int  # for a shadow policy: what it would have denied


def trend_windows(window: int) -> int:
    """How many windows a trend shows: the last 60, or the last hour if that is fewer (at least 2);
    lua/activity.lua keeps as many."""
    return max(2, min(TREND_MAX_WINDOWS, TREND_SECONDS // window))


def policy_trend(policy, *, now: float | None = None) -> list[TrendPoint]:
    """Allowed and denied in each of the policy's last windows (the current one last)."""
    return policy_trends([policy], now=now)[policy.pk if hasattr(policy, "pk") else policy.id]


def policy_trends(policies: Sequence, *, now: float | None = None) -> dict[int, list[TrendPoint]]:
    """The trends of many policy rows (or compiled policies), one short script each, sent together;
    a row that fails validation has none."""
    engine.tally.flush()  # what this process counted counts too
    compiled: list[CompiledPolicy] = []
    for row in policies:
        try:
            compiled.append(row if not hasattr(row, "pk") else compile_policy(row))
        except (ValidationError, ValueError, KeyError):
            continue
    trends: dict[int, list[TrendPoint]] = {getattr(row, "pk", getattr(row, "id", None)): [] for row in policies}
    if not compiled:
        return trends
    script = engine.scripts.get("trend", admin_client())
    shards = engine.shard_count()
    calls = [
        (
            [engine.totals_key(policy, shard)],
            [now_arg(now), policy.window_ms, policy.totals_bucket_ms, trend_windows(policy.window)],
        )
        for policy in compiled
        for shard in range(shards)
    ]
    replies = admin_call(lambda client: run_each(client, script, calls))
    for i, policy in enumerate(compiled):
        trends[policy.id] = _merged_trend(policy, replies[i * shards : (i + 1) * shards])
    return trends


def _merged_trend(policy: CompiledPolicy, replies: list[list[int]]) -> list[TrendPoint]:
    """The shards' trends added window by window (each reply starts with the server's clock when read,
    so a read that crossed into the next window still lines up)."""
    points: dict[int, list[int]] = {}
    for reply in replies:
        now_ms, values = reply[0], reply[1:]
        first = now_ms // policy.window_ms - len(values) // 2 + 1
        for i in range(len(values) // 2):
            point = points.setdefault(first + i, [0, 0])
            point[0] += values[2 * i]
            point[1] += values[2 * i + 1]
    newest = max(points)
    return [
        TrendPoint(number * policy.window, *points[number])
        for number in sorted(points)
        if number > newest - len(replies[0][1:]) // 2
    ]
