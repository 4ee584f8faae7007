"""The live page's reads: the subjects a policy's live index lists, busiest first, with their counts read
by the strategy's own Lua in batches of bounded cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import engine, strategies
from ..conf import get_setting
from ..engine import BLOCKED, Client, Script, admin_call, admin_client, figures, run_each
from .activity import policy_totals

if TYPE_CHECKING:
    from ..values import CompiledPolicy

INDEX_PAGE = 500  # live index entries read per ZREVRANGE
BATCH = 200  # counters read per call of live.lua
FIELD_BUDGET = 500  # fields one call of live.lua may read (well under 1 ms of server time)


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
    counts = _read_counters(policy, [engine.counter_key(policy, key) for key, *_ in members], now_ms, limits,
                            [engine.shard_of(key) for key, *_ in members])
    for (subject_key, _limit, overridden, display, plan), limit, (count, reset_ms) in zip(members, limits, counts):
        if count > 0 and subject_key not in subjects:  # seen under two limits: the latest entry wins
            capacity = policy.capacity(limit)  # a token bucket's count is compared with its burst
            reset_in = reset_ms / 1000
            subjects[subject_key] = SubjectUsage(subject_key, display, count, reset_in, capacity, overridden, plan)
    busiest = sorted(subjects.values(), key=lambda s: (-s.count, s.display))
    blocked = sum(1 for s in busiest if s.count >= s.limit)
    return LiveUsage(allowed, denied, max(active, len(busiest)), index_full, busiest[:rows], len(busiest), blocked)


def _listed_members(policy: CompiledPolicy, now_ms: int) -> tuple[list[tuple[str, int, bool, str, str]], bool]:
    """The live index entries whose counters may still hold requests, highest score first in each shard,
    the shards one after the other; and whether an index is full.

    Read in pages, sent together (a page is a short command; Redis serves other clients between them).
    """
    shards = engine.shard_count()
    size = -(-get_setting("RATELIMIT_LIVE_INDEX_SIZE") // shards)  # each shard's index keeps its share
    pages_per_shard = len(range(0, size + 1, INDEX_PAGE))  # + 1: an index may briefly hold one more than size

    def read(client: Client) -> list:
        with client.pipeline(transaction=False) as pipe:
            for shard in range(shards):
                live_key = engine.live_key(policy, shard)
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
    script = engine.scripts.get("live", admin_client())
    args = [str(now_ms), policy.strategy, figures(policy), FIELD_BUDGET]
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
    client: Client, script: Script, batches: list[tuple[int, list[str]]], args: list, limits: list[int] | None
) -> list:
    calls = [(batch, args + (limits[start : start + len(batch)] if limits else [])) for start, batch in batches]
    return run_each(client, script, calls)


def parse_live_member(member: str) -> tuple[str, int, bool, str, str]:
    """The parts of a live index entry written by engine.live_member: key, limit, overridden (by an
    override or a plan), display, plan."""
    subject_key, limit, display = (member.split(" ", 2) + ["", ""])[:3]
    limit, _at, plan = limit.partition("@")
    return subject_key, int(limit.rstrip("*") or 0), limit.endswith("*") or bool(plan), display, plan

