"""Resets from the live page and the `ratelimit` command: forget some subjects' counts under a policy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .. import engine
from ..deny_cache import deny_cache
from ..engine import Client, admin_call, bump_version, counter_key, live_key, server_ms, shard_of
from .usage import INDEX_PAGE, parse_live_member

if TYPE_CHECKING:
    from ..values import CompiledPolicy


def reset_subjects(policy: CompiledPolicy, subject_keys: Sequence[str]) -> list[str]:
    """Forget the counts of these subjects under this policy; returns how the index showed them."""
    if not subject_keys:
        return []
    engine.tally.flush()  # the index entries this process still owes name the subjects too
    by_shard: dict[int, list[bytes]] = {}  # each shard's index entries of these subjects
    for key in subject_keys:
        shard = shard_of(key)
        by_shard.setdefault(shard, []).extend(_index_entries(live_key(policy, shard), key))
    members = [member for entries in by_shard.values() for member in entries]

    def reset(client: Client) -> None:
        # a quota's counter is emptied for Redis's current period: its day, not this host's
        now_ms = server_ms(client) if policy.plugin else 0
        with client.pipeline(transaction=False) as pipe:
            _forget(pipe, policy, subject_keys, now_ms)
            for shard, entries in by_shard.items():
                if entries:
                    pipe.zrem(live_key(policy, shard), *entries)
            pipe.execute()

    admin_call(reset)
    # workers refusing these subjects from memory must ask Redis again: this one now, the others
    # when they see the new version (as after any policy change)
    deny_cache.clear()
    bump_version()
    return sorted({parse_live_member(member.decode())[3] for member in members})


def _forget(pipe, policy: CompiledPolicy, subject_keys: Sequence[str], now_ms: int) -> None:
    # one key a command: a cluster pipeline refuses a command on keys of several slots
    emptied = policy.plugin.emptied(policy, now_ms) if policy.plugin else None
    if emptied is None:
        for key in subject_keys:
            pipe.delete(counter_key(policy, key))
        return
    # a quota's counter is emptied, not deleted: a missing one is a loss, which the saved usage makes up for
    value, ends = emptied
    for key in subject_keys:
        pipe.set(counter_key(policy, key), value, pxat=ends)


def _index_entries(live_key: str, subject_key: str) -> list[bytes]:
    """The index entries of one subject (one per limit it was seen with), scanned a page at a time."""
    found: list[bytes] = []
    cursor = 0
    while True:
        cursor, page = admin_call(
            lambda client: client.zscan(live_key, cursor, match=f"{subject_key} *", count=INDEX_PAGE)
        )
        found += [member for member, _score in page]
        if cursor == 0:
            return found

