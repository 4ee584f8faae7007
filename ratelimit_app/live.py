"""The operator's side of Redis: what the live page and the policy list read, and resets.

Kept apart from the request path (the engine's decide): these reads go through the admin's own client
(engine/admin_connection.py), in bounded batches, so watching never holds Redis for long.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import redis
from django.core.exceptions import ValidationError
from redis.commands.core import Script

from . import strategies
from .conf import get_setting
from .deny_cache import deny_cache
from .engine import admin_call, admin_client, keys
from .engine.batches import run_each
from .engine.scripts import now_arg, scripts
from .engine.tally import tally
from .engine.version import bump_version
from .policies import compile_policy

if TYPE_CHECKING:
    from .values import CompiledPolicy

INDEX_PAGE = 500  # live index entries read per ZREVRANGE
BATCH = 200  # counters read per call of live.lua
FIELD_BUDGET = 500  # fields one call of live.lua may read (well under 1 ms of server time)
BLOCKED = 2**43  # added to the score of a subject a policy refused (lua/activity.lua)


class SubjectUsage(NamedTuple):
    key: str
    display: str
    count: int
    reset_in: float
    limit: int  # the limit in effect for this subject
    overridden: bool  # an override or a plan gave this subject a limit other than the policy's
    plan: str = ""  # the plan whose limit this subject had ('' when none)


class LiveUsage(NamedTuple):
    allowed: int  # requests counted in the window the counters use
    denied: int  # requests refused (shadow: that would have been) in that window
    active: int  # subjects active in that window, from the totals (exact unless the index was full)
    index_full: bool  # the live index holds as many subjects as it may: some active ones are not listed
    subjects: list[SubjectUsage]  # the listed subjects active now, busiest first (the top rows asked for)
    shown: int  # how many listed subjects are active now (before keeping the top rows)
    blocked: int  # how many of those are at their limit


# --- the live page ------------------------------------------------------------------------------


def live_usage(policy: CompiledPolicy, *, rows: int | None = None, now: float | None = None) -> LiveUsage:
    """Totals of the policy's window and the subjects its live index lists, busiest first (the top
    `rows` of them when given): what the live page shows.

    Every command sent is bounded (a page of the index, a batch of counters), so watching a policy
    with a million subjects never holds Redis for long; `now` (seconds) replaces the server's clock.
    Every shard of the policy is read, and merged.
    """
    allowed, denied, active, now_ms = policy_totals(policy, now=now)
    members, index_full = _listed_members(policy, now_ms)
    subjects: dict[str, SubjectUsage] = {}
    limits = [limit or policy.limit for _key, limit, *_ in members]
    counts = _read_counters(policy, [keys.counter_key(policy, key) for key, *_ in members], now_ms, limits,
                            [keys.shard_of(key) for key, *_ in members])
    for (subject_key, _limit, overridden, display, plan), limit, (count, reset_ms) in zip(members, limits, counts):
        if count > 0 and subject_key not in subjects:  # seen under two limits: the latest entry wins
            capacity = policy.capacity(limit)  # a token bucket's count is compared with its burst
            subjects[subject_key] = SubjectUsage(subject_key, display, count, reset_ms / 1000, capacity, overridden, plan)
    busiest = sorted(subjects.values(), key=lambda s: (-s.count, s.display))
    blocked = sum(1 for s in busiest if s.count >= s.limit)
    return LiveUsage(allowed, denied, max(active, len(busiest)), index_full, busiest[:rows], len(busiest), blocked)


def policy_totals(policy: CompiledPolicy, *, now: float | None = None) -> tuple[int, int, int, int]:
    """(allowed, denied, active subjects, now in ms by the server's clock) of the policy's window,
    summed over its shards (a subject lives in one shard)."""
    tally.flush()  # what this process counted counts too
    script = scripts.get("totals", admin_client())
    args = [now_arg(now), policy.window_ms, policy.totals_bucket_ms]
    calls = [([keys.totals_key(policy, shard)], args) for shard in range(keys.shards())]
    replies = admin_call(lambda client: run_each(client, script, calls))
    allowed, denied, active = (sum(reply[i] for reply in replies) for i in (1, 2, 3))
    return allowed, denied, active, replies[0][0]


def _listed_members(policy: CompiledPolicy, now_ms: int) -> tuple[list[tuple[str, int, bool, str, str]], bool]:
    """The live index entries whose counters may still hold requests, highest score first in each shard,
    the shards one after the other; and whether an index is full.

    Read in pages, sent together (a page is a short command; Redis serves other clients between them).
    """
    shards = keys.shards()
    size = -(-get_setting("RATELIMIT_LIVE_INDEX_SIZE") // shards)  # each shard's index keeps its share
    pages_per_shard = len(range(0, size + 1, INDEX_PAGE))  # + 1: an index may briefly hold one more than size

    def read(client: redis.Redis) -> list:
        with client.pipeline(transaction=False) as pipe:
            for shard in range(shards):
                live_key = keys.live_key(policy, shard)
                for start in range(0, size + 1, INDEX_PAGE):
                    pipe.zrevrange(live_key, start, start + INDEX_PAGE - 1, withscores=True)
            return pipe.execute()

    pages = admin_call(read)
    members, index_full = [], False
    for shard in range(shards):
        entries = [entry for page in pages[shard * pages_per_shard : (shard + 1) * pages_per_shard] for entry in page]
        index_full = index_full or len(entries) >= size
        for member, score in entries:
            ends = score - BLOCKED if score > BLOCKED else score
            if ends > now_ms:
                members.append(parse_live_member(member.decode()))
    return members, index_full


def _read_counters(
    policy: CompiledPolicy, counter_keys: list[str], now_ms: int, limits: list[int], shards: list[int]
) -> list[tuple[int, int]]:
    """(count, ms until empty) of each counter, by the strategy's own Lua, in calls of bounded cost;
    `shards` (each key's, keys of one shard side by side): a call reads one shard, one cluster slot.

    The batches are sent together; a call that spent its budget early leaves the rest of its batch
    for the next round.
    """
    script = scripts.get("live", admin_client())
    args = [str(now_ms), policy.strategy, policy.window_ms, policy.bucket_ms, FIELD_BUDGET]
    counts: dict[int, tuple[int, int]] = {}
    size = _batch_size(policy)
    # a token bucket's count depends on the subject's rate: its limits go with its keys
    per_key = strategies.get(policy.strategy).live_per_key
    pending = [
        (start, counter_keys[start:end])
        for first, last in _runs(shards)
        for start in range(first, last, size)
        for end in [min(start + size, last)]
    ]
    while pending:
        replies = admin_call(lambda client: _run_batches(client, script, pending, args, limits if per_key else None))
        left = []
        for (start, batch), reply in zip(pending, replies):
            read = reply[1]
            for i in range(read):
                counts[start + i] = (reply[2 + 2 * i], reply[3 + 2 * i])
            if read < len(batch):
                left.append((start + read, batch[read:]))
        pending = left
    return [counts[i] for i in range(len(counter_keys))]


def _runs(shards: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of equal shards."""
    runs: list[tuple[int, int]] = []
    for i, shard in enumerate(shards):
        if i and shard == shards[i - 1]:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _batch_size(policy: CompiledPolicy) -> int:
    """As many counters as fit the budget at worst (the strategy knows what one read costs it)."""
    return strategies.get(policy.strategy).live_batch(policy, BATCH, FIELD_BUDGET)


def _run_batches(
    client: redis.Redis, script: Script, batches: list[tuple[int, list[str]]], args: list, limits: list[int] | None
) -> list:
    calls = [(batch, args + (limits[start : start + len(batch)] if limits else [])) for start, batch in batches]
    return run_each(client, script, calls)


def parse_live_member(member: str) -> tuple[str, int, bool, str, str]:
    """The parts of a live index entry written by engine.live_member: key, limit, overridden (by an
    override or a plan), display, plan."""
    subject_key, limit, display = (member.split(" ", 2) + ["", ""])[:3]
    limit, _at, plan = limit.partition("@")
    return subject_key, int(limit.rstrip("*") or 0), limit.endswith("*") or bool(plan), display, plan


# --- resets -------------------------------------------------------------------------------------


def reset_subjects(policy: CompiledPolicy, subject_keys: Sequence[str]) -> list[str]:
    """Forget the counts of these subjects under this policy; returns how the index showed them."""
    if not subject_keys:
        return []
    tally.flush()  # the index entries this process still owes name the subjects too
    by_shard: dict[int, list[bytes]] = {}  # each shard's index entries of these subjects
    for key in subject_keys:
        by_shard.setdefault(keys.shard_of(key), []).extend(_index_entries(keys.live_key(policy, keys.shard_of(key)), key))
    members = [member for entries in by_shard.values() for member in entries]

    def reset(client: redis.Redis) -> None:
        with client.pipeline(transaction=False) as pipe:
            for key in subject_keys:  # one key a DEL: a cluster pipeline refuses keys of several slots
                pipe.delete(keys.counter_key(policy, key))
            for shard, entries in by_shard.items():
                if entries:
                    pipe.zrem(keys.live_key(policy, shard), *entries)
            pipe.execute()

    admin_call(reset)
    # workers refusing these subjects from memory must ask Redis again: this one now, the others
    # when they see the new version (as after any policy change)
    deny_cache.clear()
    bump_version()
    return sorted({parse_live_member(member.decode())[3] for member in members})


def _index_entries(live_key: str, subject_key: str) -> list[bytes]:
    """The index entries of one subject (one per limit it was seen with), scanned a page at a time."""
    found: list[bytes] = []
    cursor = 0
    while True:
        cursor, page = admin_call(lambda client: client.zscan(live_key, cursor, match=f"{subject_key} *", count=INDEX_PAGE))
        found += [member for member, _score in page]
        if cursor == 0:
            return found


# --- the policy list ----------------------------------------------------------------------------


class PolicyActivity(NamedTuple):
    active: int  # subjects active in the policy's window
    allowed: int  # requests counted in that window
    denied: int  # requests denied (shadow: that would have been) in that window


def policy_activity(policies: Sequence) -> dict[int, PolicyActivity | None]:
    """Activity of many policy rows in their window, one short script each, sent together; None
    for a row that fails validation (it is not enforced)."""
    tally.flush()  # what this process counted counts too
    compiled: list[CompiledPolicy] = []
    activity: dict[int, PolicyActivity | None] = {}
    for row in policies:
        try:
            compiled.append(compile_policy(row))
        except (ValidationError, ValueError, KeyError):
            activity[row.pk] = None
    if not compiled:
        return activity
    script = scripts.get("totals", admin_client())
    shards = keys.shards()
    calls = [
        ([keys.totals_key(policy, shard)], ["", policy.window_ms, policy.totals_bucket_ms])
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
    tally.flush()  # what this process counted counts too
    compiled: list[CompiledPolicy] = []
    for row in policies:
        try:
            compiled.append(row if not hasattr(row, "pk") else compile_policy(row))
        except (ValidationError, ValueError, KeyError):
            continue
    trends: dict[int, list[TrendPoint]] = {getattr(row, "pk", getattr(row, "id", None)): [] for row in policies}
    if not compiled:
        return trends
    script = scripts.get("trend", admin_client())
    shards = keys.shards()
    calls = [
        ([keys.totals_key(policy, shard)], [now_arg(now), policy.window_ms, policy.totals_bucket_ms, trend_windows(policy.window)])
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
