"""What reaches the policies' records (totals, live index, active subjects) from the workers rather
than from the decision itself.

A decision writes nothing but its counters (anything more is one more command on every request); the
engine hands what it admitted and refused, where each subject stands and where its counter now
empties to the tally instead, and the refusals of the local deny cache join them. A background
thread writes what is pending at most FLUSH_SECONDS later (lua/tally.lua), in one call per shard; a
reader in this process flushes first, so what it shows is complete. The records of other processes
are at most FLUSH_SECONDS behind; a process that exits flushes what it holds.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import socket
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Iterable

import redis
from redis.exceptions import RedisClusterException

from . import keys
from ..conf import get_setting
from .clients import client
from .hooks import hooks
from .batches import ran_nothing, run_each
from .scripts import HEARTBEAT_EVERY, heartbeat, scripts
from .server_clock import server_clock

REPORTS_KEPT_MS = 120_000  # engine.version.REPORTS_KEPT: what a worker said is shown that long

if TYPE_CHECKING:
    from ..values import CompiledPolicy

logger = logging.getLogger("ratelimit_app")
FLUSH_SECONDS = 0.25
RETRY_MOST = 4.0  # seconds between flushes at most while Redis cannot be reached
BLOCKED = 2**43  # added to the live index score of a subject a policy refused (lua/activity.lua)
NOW = -1  # a bucket number meaning "the bucket of the flush's own time" (the deny cache knows no Redis time)


class _Pending:
    """What one process owes Redis, by policy and shard."""

    def __init__(self) -> None:
        # requests by (policy, shard, series: 'a' allowed / 'd' refused, totals bucket number or NOW)
        self.counts: Counter[tuple[CompiledPolicy, int, str, int]] = Counter()
        # the live index entries by (policy, shard): member -> score, the latest wins
        self.entries: dict[tuple[CompiledPolicy, int], dict[str, float]] = {}
        # subjects more (fewer) whose counters empty in a totals bucket, by (policy, shard, bucket number)
        self.moves: Counter[tuple[CompiledPolicy, int, int]] = Counter()

    def __bool__(self) -> bool:
        return bool(self.counts or self.entries or self.moves)

    def merge(self, other: _Pending) -> None:
        self.counts.update(other.counts)
        for group, members in other.entries.items():
            self.entries[group] = {**members, **self.entries.get(group, {})}  # what was added since is newer
        self.moves.update(other.moves)

    def groups(self) -> dict[tuple[CompiledPolicy, int], tuple[list, list, dict]]:
        """(counts, moves, entries) by (policy, shard)."""
        found: dict[tuple[CompiledPolicy, int], tuple[list, list, dict]] = {}
        for (policy, shard, series, bucket), amount in self.counts.items():
            found.setdefault((policy, shard), ([], [], {}))[0].append((series, "" if bucket == NOW else bucket, amount))
        for (policy, shard, bucket), delta in self.moves.items():
            if delta:
                found.setdefault((policy, shard), ([], [], {}))[1].append((bucket, delta))
        for group, members in self.entries.items():
            found.setdefault(group, ([], [], {}))[2].update(members)
        return found


class Tally:
    def __init__(self) -> None:
        self._pending = _Pending()
        # what decisions noted since the last flush (verdicts.py), in order: the tally keys of the requests
        # that only count (most: the same key object again and again within a totals bucket), and NOTED
        # fields a record of those that write more. Flat, so that what waits for the flush is no object of
        # its own for the garbage collector. Requests extend them and a folder (under the lock) takes their
        # heads, each a step in C that no other thread interrupts
        self._counted: list = []
        self._noted: list = []
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # a reader's flush waits for the one under way, then sees its counts
        self._flusher: threading.Timer | None = None
        self._retry_in = FLUSH_SECONDS  # until the next flush, after one that could not reach Redis
        self._exiting = False  # the last flush: nothing is kept for later
        self._heartbeat_due = 0.0  # monotonic time of the next word that this worker runs its library

    def add(
        self, counts: Iterable[tuple[CompiledPolicy, int, str, int]], entries: Iterable = (), moves: Iterable = ()
    ) -> None:
        """One more request for each (policy, shard, series, totals bucket number or NOW); the live
        index `entries` (policy, shard, member, score); the `moves` (policy, shard, bucket number, delta)."""
        with self._lock:
            pending = self._pending
            tallied = pending.counts
            for count in counts:  # rather than Counter.update, whose checks cost more than this loop
                tallied[count] = tallied.get(count, 0) + 1
            for policy, shard, member, score in entries:
                group = pending.entries.get((policy, shard))
                if group is None:
                    group = pending.entries[(policy, shard)] = {}
                group[member] = score
            for policy, shard, bucket, delta in moves:
                pending.moves[(policy, shard, bucket)] += delta
        if self._flusher is None:
            self._arm()

    def note(self, noted: list[tuple], counted: list[tuple]) -> None:
        """What one decision counted or refused, by policy: the `counted` keys (policy, shard, series, totals
        bucket number) of those that only count a request, and the records (policy, live member, shard,
        refused before here, exceeded, count, reset ms, ms before, now ms, cost) of those that may write more
        (verdicts.py tells). The flush works out the totals and the live index from them (_fold_noted): a
        request only appends, without a lock."""
        fields = self._noted
        for record in noted:
            fields.extend(record)  # runs in C, whole: a flush never finds part of a policy's fields
        self._counted.extend(counted)
        if len(fields) > MOST_FIELDS or len(self._counted) > MOST_NOTED:
            # the flush is late (stalled): what waits past the bound is folded now, the oldest first
            with self._lock:
                _fold_noted(self._pending, fields, max(0, len(fields) // NOTED - MOST_NOTED))
                _fold_counted(self._pending, self._counted, max(0, len(self._counted) - MOST_NOTED))
        if self._flusher is None:
            self._arm()

    def _arm(self, delay: float = FLUSH_SECONDS) -> None:
        with self._lock:
            if self._flusher is None:
                self._flusher = threading.Timer(delay, self.flush)
                self._flusher.daemon = True
                self._flusher.start()

    def flush(self) -> None:
        """Write what is pending to the policies' records in Redis (kept for later if Redis cannot be reached)."""
        with self._flushing:
            self._flush()
        hooks.flushed()  # the metrics fold their tallies on this thread, which runs only while there are requests

    def flush_at_exit(self) -> None:
        """The process's last flush: what cannot reach Redis now is logged as lost, and no timer is armed
        to send it (none would run; Python 3.12 refuses to start a thread at exit)."""
        self._exiting = True
        self.flush()

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending, self._flusher = self._pending, _Pending(), None
            # a decision noted meanwhile is in this flush, or arms the next
            _fold_noted(pending, self._noted, len(self._noted) // NOTED)
            _fold_counted(pending, self._counted, len(self._counted))
        if not pending:
            return
        by_shard: dict[int, tuple[list[str], list[str | int]]] = {}  # one call per shard: one cluster slot each
        size = -(-get_setting("RATELIMIT_LIVE_INDEX_SIZE") // keys.shards())  # each shard's index keeps its share
        for (policy, shard), (counts, moves, entries) in pending.groups().items():
            script_keys, args = by_shard.setdefault(shard, ([], [""]))
            script_keys += [keys.totals_key(policy, shard), keys.live_key(policy, shard)]
            args += [policy.window_ms, policy.totals_bucket_ms, size, len(counts)]
            for count in counts:
                args += count
            args.append(len(moves))
            for move in moves:
                args += move
            args.append(len(entries))
            for member, score in entries.items():
                args += (repr(score), member)
        try:
            redis_client = client()  # a cluster client connects as it is created: inside the try
        except (redis.RedisError, RedisClusterException) as error:
            self._keep(pending, error)
            return
        self._heartbeat()
        shards = list(by_shard)
        replies = run_each(redis_client, scripts.get("tally", redis_client), [by_shard[shard] for shard in shards],
                           raise_on_error=False)
        unsent = [(shard, reply) for shard, reply in zip(shards, replies) if ran_nothing(reply)]
        lost = [reply for reply in replies if isinstance(reply, Exception) and not ran_nothing(reply)]
        if lost:
            # Sent: the server may have run the script and only its answer is lost (a timeout).
            # Never sent again: a few counts missing from a monitoring total beat counting them twice.
            logger.warning("ratelimit: counts for the policies' totals may not have reached Redis: %s", lost[0])
        if unsent:  # these shards' calls ran nothing (never sent, or refused): their records wait for the next flush
            self._keep(_of_shards(pending, [shard for shard, _ in unsent]), unsent[0][1])
        else:
            self._retry_in = FLUSH_SECONDS

    def _heartbeat(self) -> None:
        """Every HEARTBEAT_EVERY seconds of use, say that this worker runs its library (so that a prune
        keeps it) and read Redis's clock again: from the flusher's thread, never on a request's way."""
        if time.monotonic() < self._heartbeat_due:
            return
        self._heartbeat_due = time.monotonic() + HEARTBEAT_EVERY
        try:
            redis_client = client()
            server_clock.read(redis_client)
            heartbeat(redis_client)
            state = hooks.worker_state()
            if state:  # how old the policies it enforces are: `ratelimit status` shows every worker's
                # the hash goes when no worker has said anything for REPORTS_KEPT: no key without an expiry
                pipe = redis_client.pipeline(transaction=False)
                worker = f"{socket.gethostname()}:{os.getpid()}"  # read now: a forked worker is another
                pipe.hset(keys.workers_key(), worker, f"{time.time():.0f}|{state}")
                pipe.pexpire(keys.workers_key(), REPORTS_KEPT_MS)
                pipe.execute()
        except (redis.RedisError, RedisClusterException) as error:
            logger.warning("ratelimit: could not say which library this worker runs: %s", error)

    def _keep(self, pending: _Pending, error: BaseException) -> None:
        """Keep what could not be sent for a flush that waits longer after each failure (up to RETRY_MOST
        seconds): an idle worker sends it too, once Redis is back."""
        if self._exiting:
            logger.warning("ratelimit: counts for the policies' totals are lost: the process exits and Redis "
                           "cannot be reached: %s", error)
            return
        logger.warning("ratelimit: counts for the policies' totals could not reach Redis yet: %s", error)
        with self._lock:
            self._pending.merge(pending)
            delay, self._retry_in = self._retry_in, min(2 * self._retry_in, RETRY_MOST)
        self._arm(delay)

    def discard(self) -> None:
        """Forget what is pending, once a flush under way has ended (tests: what one test counted must
        not reach the next one's Redis)."""
        with self._flushing, self._lock:
            self._pending = _Pending()
            self._noted.clear()
            self._counted.clear()

    def _forked(self) -> None:
        # a forked child has no flusher thread and must not add its parent's counts a second time
        self._pending, self._lock, self._flushing, self._flusher = _Pending(), threading.Lock(), threading.Lock(), None
        self._retry_in, self._exiting = FLUSH_SECONDS, False
        self._noted, self._counted = [], []
        self._heartbeat_due = 0.0

    def _multiprocessing_child(self) -> None:
        # a multiprocessing child ends with os._exit, past atexit: its own exit hook flushes
        multiprocessing.util.Finalize(None, self.flush_at_exit, exitpriority=10)


NOTED = 10  # fields a decision notes for each of its policies that writes more than a count (Tally.note)
# records that wait for the flush at most, of either kind (about 0.75 MB): past it, as while a flush is stalled,
# each request folds its own, so a worker's memory stays bounded (a flush every 0.25 s drains them long before)
MOST_NOTED = 4096
MOST_FIELDS = MOST_NOTED * NOTED


def _fold_counted(pending: _Pending, counted: list, records: int) -> None:
    """Add the oldest `records` keys of `counted` to `pending`'s counts, a request each (under the tally's
    lock). Counted in C: most are one key object, which a list counts by identity."""
    if not records:
        return
    keys = counted[:records]  # a key noted meanwhile stays, after these
    del counted[:records]
    first = keys[0]
    # one key (one policy, one totals bucket): counted by identity; several (the last differs): hashed
    sums = ((first, records),) if keys[-1] is first and keys.count(first) == records else Counter(keys).items()
    tallied = pending.counts
    for key, amount in sums:
        tallied[key] = tallied.get(key, 0) + amount


def _fold_noted(pending: _Pending, noted: list, records: int) -> None:
    """Fold the oldest `records` of `noted` into `pending`, in order (under the tally's lock: one folder at a
    time): the live index keeps a subject's latest entry."""
    if not records:
        return
    fields = noted[:records * NOTED]  # a record noted meanwhile stays, after these
    del noted[:records * NOTED]
    for at in range(0, records * NOTED, NOTED):
        _fold(pending, *fields[at:at + NOTED])


def _fold(pending: _Pending, policy: CompiledPolicy, member: str, shard: int, refused_before: bool, exceeded: bool,
          count: int, reset_ms: int, before_ms: int, now_ms: int, cost: int) -> None:
    """Add what a policy's decision noted to `pending`: a request counted or refused (the totals), where
    the subject stands (the live index) and where its counter now empties (the count of active subjects).

    A subject's index entry is written when its meaning changes: the counter empties in another
    totals bucket, the subject is refused or admitted again after a refusal, or its count reaches
    2, 4, 8, ... (log2 of the limit writes a window), so a busy subject costs the index little."""
    bucket = policy.totals_bucket_ms
    pending.counts[(policy, shard, "d" if exceeded else "a", now_ms // bucket)] += 1
    after = -(-(now_ms + reset_ms) // bucket)  # the totals bucket in which the counter empties
    if exceeded:
        if not refused_before:
            pending.entries.setdefault((policy, shard), {})[member] = BLOCKED + after * bucket
        return
    moved = before_ms == -1
    if moved:
        pending.moves[(policy, shard, after)] += 1
    elif before_ms >= 0:
        before = -(-(now_ms + before_ms) // bucket)
        if before != after:
            moved = True
            pending.moves[(policy, shard, after)] += 1
            pending.moves[(policy, shard, before)] -= 1
    power = 1 << max(count.bit_length() - 1, 0)  # the highest power of 2 the count reached
    if moved or refused_before or 2 <= power > count - cost:
        # busier subjects score a little higher among those emptying together (log2 / 64, under 1 ms)
        pending.entries.setdefault((policy, shard), {})[member] = after * bucket + min(63, count.bit_length() - 1) / 64


def _of_shards(pending: _Pending, shards: list[int]) -> _Pending:
    """The part of `pending` that goes to these shards."""
    part, wanted = _Pending(), set(shards)
    part.counts.update({count: amount for count, amount in pending.counts.items() if count[1] in wanted})
    part.entries.update({group: members for group, members in pending.entries.items() if group[1] in wanted})
    part.moves.update({move: delta for move, delta in pending.moves.items() if move[1] in wanted})
    return part


tally = Tally()
atexit.register(tally.flush_at_exit)
os.register_at_fork(after_in_child=tally._forked)
multiprocessing.util.register_after_fork(tally, Tally._multiprocessing_child)
