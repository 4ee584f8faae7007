"""Calendar quotas' usage in the database: what was saved for a period Redis lost, and the saver that
writes usage there every few seconds. The engine reaches both through its hooks (set at the bottom);
the periods are the strategy's own (its plug-in: strategies/base.py `asked`).

A period's counter lives in Redis; its usage is also upserted here, batched, at most
RATELIMIT_QUOTA_SAVE_SECONDS after a decision (the most a loss of Redis can take away). When Redis has
no counter for the current period, the script says so and the worker asks again with the saved usage:
one query for a subject's first decision of a period (or after a loss), none in steady state.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from datetime import datetime, timezone
from time import monotonic
from typing import Iterable, NamedTuple, Sequence

from django.conf import settings
from django.db import DatabaseError, connections, router, transaction
from django.core.exceptions import ValidationError
from django.db.models import F, Q
from django.utils import timezone as django_timezone
from redis.exceptions import RedisError

from .conf import get_setting
from . import engine
from .loading import compile_policy
from .loggate import LogGate
from .models import Policy, QuotaUsage
from .values import Adjustment, Check, CompiledPolicy

logger = logging.getLogger("ratelimit_app")


def as_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def as_stored(ms: int) -> datetime:
    """An instant as the database holds it: aware with USE_TZ, else naive in TIME_ZONE (what Django
    writes and reads then; an aware value is refused by SQLite and MySQL)."""
    moment = as_datetime(ms)
    return moment if settings.USE_TZ else django_timezone.make_naive(moment, django_timezone.get_default_timezone())


def as_instant(value: datetime) -> datetime:
    """A datetime read from the database as an instant in UTC (a naive one is in TIME_ZONE: USE_TZ False).
    A naive time of the hour a DST change repeats is read as its first pass."""
    if django_timezone.is_naive(value):
        value = django_timezone.make_aware(value, django_timezone.get_default_timezone())
    return value.astimezone(timezone.utc)


unreadable_said = LogGate()  # the saved usage could not be read


def saved(checks: Iterable[Check], now_ms: int) -> dict[tuple[int, str], tuple[int, int]]:
    """(policy id, subject key) -> (period start ms, used) for every check, 0 where nothing was saved:
    one query (the saver's pending usage counts too, being newer than the database). Only usage counted in
    the policy's unit now is read: tokens saved before it counted requests never start its counter."""
    starts = {
        (check.policy.id, check.subject.key): check.policy.plugin.span(check.policy, now_ms)[0] for check in checks
    }
    units = {check.policy.id: check.policy.unit for check in checks}
    query = Q()
    for (policy_id, subject), start in starts.items():
        query |= Q(policy_id=policy_id, subject=subject, period_start=as_stored(start), unit=units[policy_id])
    found = {key: (start, 0) for key, start in starts.items()}
    try:
        rows = QuotaUsage.objects.filter(query).values_list("policy_id", "subject", "used")
        for policy_id, subject, used in rows:
            found[(policy_id, subject)] = (starts[(policy_id, subject)], used)
    except DatabaseError as error:  # the period starts from what Redis and this worker know
        if unreadable_said.due():  # at each new subject's first request of a period: said once a minute
            logger.warning("ratelimit: the saved usage of a quota could not be read (its period starts from what "
                           "Redis holds): %s", error)
    generations = {check.policy.id: check.policy.generation for check in checks}
    for key, (start, used) in list(found.items()):
        pending = saver.pending_used((key[0], key[1], start, units[key[0]]), generations[key[0]])
        if pending > used:
            found[key] = (start, pending)
    return found


# --- saving usage ------------------------------------------------------------------------------------


Key = tuple[int, str, int, str]  # what usage is saved by: (policy id, subject key, period start ms, unit)


class Usage(NamedTuple):
    display: str
    used: int | None  # None: a settle moved the counter, its count is read from Redis when saved
    generation: int  # the policy's when counted: a reset of every subject makes earlier counts stale
    limit: int | None = None  # the subject's limit when counted (a plan's, an override's): billing reads it
    at_us: int = 0  # Redis's time of the count: the latest wins, here and in the database
    policy: CompiledPolicy | None = None  # where its counter lives in Redis
    settled: float = 0.0  # monotonic time of the last settle heard of (0: none)


KEPT_WHILE_REFUSED = 100_000  # subjects' usage a worker keeps unsaved while the database refuses it (~40 MB)
# a settle heard of this recently may not have reached Redis when its counter is read (a settle waits up to
# a second for a write to carry it): the counter is read again at the next save
SETTLE_LAG_SECONDS = 2.0
PACK = 1_000_000  # lua/calendar_quota.lua's counter: count * PACK + the period's number


def _newer(known: Usage | None, usage: Usage) -> bool:
    if known is None:
        return True
    if usage.used is None:  # a mark to read again is never newer than a count
        return False
    return known.used is None or (known.generation, known.at_us) <= (usage.generation, usage.at_us)


class Saver:
    """Usage to upsert, by (policy id, subject key, period start ms, unit). A save reads the true counters of what
    it saves from Redis (a settle moves them back as well as on); the latest count by Redis's clock wins,
    here and in the database (several workers save one subject, in any order)."""

    def __init__(self) -> None:
        self._pending: dict[Key, Usage] = {}
        self._lock = threading.Lock()
        self._saving = threading.Lock()
        self._timer: threading.Timer | None = None
        self._refused = False  # the last save failed: what waits is bounded until one succeeds

    def record(
        self, policy: CompiledPolicy, subject_key: str, display: str, start_ms: int, used: int, limit: int | None = None
    ) -> None:
        usage = Usage(display, used, policy.generation, limit, engine.server_clock.now_ms() * 1000, policy)
        self._put((policy.id, subject_key, start_ms, policy.unit), usage)

    def settled(self, adjustments: Sequence[Adjustment]) -> None:
        """Settles about to move quota counters: their usage is saved again, as Redis then holds it."""
        for adjustment in adjustments:
            charged = adjustment.charged
            policy = charged.policy
            if policy.plugin is None:
                continue
            start = policy.plugin.span(policy, engine.server_clock.now_ms())[0]
            if policy.plugin.settling(policy, 0, start)[1] == charged.anchor:  # else settle.lua leaves it alone
                self.mark(policy, charged.subject.key, charged.subject.display, start, monotonic())

    def mark(self, policy: CompiledPolicy, subject_key: str, display: str, start_ms: int, settled: float = 0.0) -> None:
        """Save this subject's usage at the next save, as its counter in Redis holds it then (`display` ''
        leaves a saved row's as it is)."""
        key = (policy.id, subject_key, start_ms, policy.unit)
        with self._lock:
            known = self._pending.get(key)
            if known is not None:
                self._pending[key] = known._replace(settled=max(settled, known.settled))
                return
        self._put(key, Usage(display, None, policy.generation, None, 0, policy, settled))

    def _put(self, key: Key, usage: Usage) -> None:
        with self._lock:
            known = self._pending.get(key)
            if known is None and self._refused and len(self._pending) >= KEPT_WHILE_REFUSED:
                pass  # the database is away: Redis still holds the count, the backup of it is bounded
            elif _newer(known, usage):
                self._pending[key] = usage._replace(settled=max(usage.settled, known.settled if known else 0.0))
            self._schedule()

    def _schedule(self) -> None:
        """A save in RATELIMIT_QUOTA_SAVE_SECONDS unless one is due (called under self._lock). A timer whose
        thread died before saving is replaced: what waits would otherwise never be saved."""
        if self._timer is not None and self._timer.is_alive():
            return
        timer = threading.Timer(get_setting("RATELIMIT_QUOTA_SAVE_SECONDS"), self._timed)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # no thread to be had (the interpreter is exiting): atexit saves what waits
            return
        self._timer = timer

    def pending_used(self, key: Key, generation: int) -> int:
        known = self._pending.get(key)
        return (known.used or 0) if known and known.generation >= generation else 0

    def _timed(self) -> None:
        try:
            self.save()
        except Exception:  # save() keeps its batch; this thread must end quietly whatever happened
            logger.exception("ratelimit: the quota usage saver failed")
        finally:
            try:
                connections.close_all()  # this thread's connections: the timer's thread ends here
            except Exception as error:  # noqa: BLE001 - a connection the outage broke may fail to close
                logger.warning("ratelimit: the quota usage saver's connection did not close: %s", error)

    def save(self) -> int:
        """Upsert what is pending, all or nothing, each count as Redis holds it now; how many rows. What the
        database refuses is kept (bounded) and saved on the timer once it answers again; a count Redis could
        not be asked for is saved as last seen and read again on the timer: a save runs until nothing waits."""
        with self._saving:
            with self._lock:
                pending, self._pending, self._timer = self._pending, {}, None
            if not pending:
                return 0
            pending, again = _read_counters(pending)
            rows = {key: usage for key, usage in pending.items() if usage.used is not None}
            try:
                if rows:
                    _upsert(rows)
            except Exception as error:  # noqa: BLE001 - whatever the database raised, the usage is kept for later
                logger.warning("ratelimit: quota usage could not be saved yet: %s", error)
                self._keep(pending)
                return 0
            self._refused = False
            self._keep({key: usage._replace(used=None, at_us=0) for key, usage in again.items()}, refused=False)
            return len(rows)

    def _keep(self, pending: dict[Key, Usage], refused: bool = True) -> None:
        """Put back a batch the database refused, under what was counted since, and save it again on the timer."""
        if not pending:
            return
        with self._lock:
            self._refused = self._refused or refused
            for key, usage in pending.items():
                known = self._pending.get(key)
                if known is None and len(self._pending) >= KEPT_WHILE_REFUSED:
                    continue
                if _newer(known, usage):
                    self._pending[key] = usage
            self._schedule()

    def discard(self) -> None:
        """Forget what is pending (tests: one test's usage must not reach the next one's database)."""
        with self._saving, self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._pending, self._timer, self._refused = {}, None, False

    def _forked(self) -> None:
        self._pending, self._lock, self._saving, self._timer = {}, threading.Lock(), threading.Lock(), None
        self._refused = False


unread_said = LogGate()  # the counters could not be read from Redis when saving


def _read_counters(pending: dict[Key, Usage]) -> tuple[dict, dict]:
    """`pending` with each count as its counter in Redis holds it now (one script per slot, off the request
    path), and what to read again at the next save: all of it when Redis could not be asked, else what a
    settle heard of just now may yet move. A counter Redis lost, or of an ended period, keeps the count seen."""
    pending = dict(pending)
    try:
        asked = [key for key, usage in pending.items() if usage.policy is not None and usage.policy.plugin is not None]
        values = engine.counters_now([(pending[key].policy, key[1]) for key in asked])
        for key, (at_us, value) in zip(asked, values):
            usage = pending[key]
            if value in (b"", ""):
                continue
            stored = int(value)
            if stored % PACK == usage.policy.plugin.settling(usage.policy, 0, key[2])[1]:
                pending[key] = usage._replace(used=stored // PACK, at_us=at_us)
    except (RedisError, OSError) as error:
        if unread_said.due():
            logger.warning("ratelimit: the quota counters could not be read to save them (saved as last seen, "
                           "read again later): %s", error)
        return pending, pending
    now = monotonic()
    return pending, {key: usage for key, usage in pending.items() if now - usage.settled < SETTLE_LAG_SECONDS}


BATCH = 500  # rows per INSERT


def _upsert(pending: dict[Key, Usage]) -> None:
    """INSERT ... ON CONFLICT keeping the latest count by Redis's clock (what several workers saw of one
    period, saved in any order): `updated` is the moment Redis held it."""
    alias = router.db_for_write(QuotaUsage)
    connection = connections[alias]
    table = connection.ops.quote_name(QuotaUsage._meta.db_table)
    larger = {"postgresql": "GREATEST", "mysql": "GREATEST"}.get(connection.vendor, "MAX")
    # a policy deleted meanwhile takes its usage with it; counts from before a reset of every subject are stale
    generations = dict(
        Policy.objects.using(alias).filter(pk__in={key[0] for key in pending}).values_list("pk", "generation")
    )
    rows = [
        (policy_id, subject, usage.display[:100], as_stored(start), unit, usage.used, usage.limit,
         as_stored(usage.at_us / 1000), 0)
        for (policy_id, subject, start, unit), usage in pending.items()
        if usage.generation >= generations.get(policy_id, usage.generation + 1)
    ]
    limit = connection.ops.quote_name("limit")  # a reserved word in SQL
    columns = f"policy_id, subject, display, period_start, unit, used, {limit}, updated, kept"
    # the latest count by Redis's clock, never below what a reset kept; the limit of the latest save: a plan
    # changed within the period bills by the one in force at its end
    if connection.vendor == "mysql":
        conflict = (
            "ON DUPLICATE KEY UPDATE used = IF(VALUES(updated) >= updated, GREATEST(VALUES(used), kept), used), "
            "display = COALESCE(NULLIF(VALUES(display), ''), display), "
            f"{limit} = COALESCE(VALUES({limit}), {limit}), updated = GREATEST(updated, VALUES(updated))"
        )
    else:
        conflict = (
            "ON CONFLICT (policy_id, subject, period_start, unit) DO UPDATE SET "
            f"used = CASE WHEN excluded.updated >= {table}.updated THEN {larger}(excluded.used, {table}.kept) "
            f"ELSE {table}.used END, "
            f"display = COALESCE(NULLIF(excluded.display, ''), {table}.display), "
            f"{limit} = COALESCE(excluded.{limit}, {table}.{limit}), "
            f"updated = {larger}({table}.updated, excluded.updated)"
        )
    # one transaction: a batch the database refuses half-way is kept whole and saved again, none of it twice
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        for first in range(0, len(rows), BATCH):
            batch = rows[first : first + BATCH]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(batch))
            params = [
                connection.ops.adapt_datetimefield_value(value) if isinstance(value, datetime) else value
                for row in batch for value in row
            ]
            cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {values} {conflict}", params)


def keep_before_reset(policy: CompiledPolicy, subject_key: str, display: str, now_ms: int) -> None:
    """Before one subject's counter is reset: what it used of the current period is saved, read from Redis,
    and kept (its saved usage never falls below it), so that billing keeps it."""
    start = policy.plugin.span(policy, now_ms)[0]
    saver.mark(policy, subject_key, display, start)
    saver.save()
    try:
        QuotaUsage.objects.filter(
            policy_id=policy.id, subject=subject_key, period_start=as_stored(start), unit=policy.unit
        ).update(kept=F("used"))
    except DatabaseError as error:  # the reset goes on: the usage saved before it stays, not kept above the new counts
        logger.warning("ratelimit: the usage of a reset subject could not be kept for billing: %s", error)


def forget_current(policy: Policy, now_ms: int) -> None:
    """Every subject of `policy` starts afresh (a new generation): a quota's usage saved for the period
    containing `now_ms` goes too, else the new counters would start from it."""
    if not policy.period:
        return
    try:
        compiled = compile_policy(policy)
    except ValidationError:  # a bad row counts nothing: nothing of it to start afresh
        return
    if compiled.plugin is not None:
        start = compiled.plugin.span(compiled, now_ms)[0]
        QuotaUsage.objects.filter(policy=policy, period_start=as_stored(start)).delete()


saver = Saver()
atexit.register(saver.save)
os.register_at_fork(after_in_child=saver._forked)
# the engine hands each count of a quota to the saver, and asks here for a period Redis lost
engine.hooks.counted, engine.hooks.settled, engine.hooks.saved_usage = saver.record, saver.settled, saved
