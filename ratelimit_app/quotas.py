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
from typing import Iterable, NamedTuple

from django.conf import settings
from django.db import DatabaseError, connections, router, transaction
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone as django_timezone

from .conf import get_setting
from . import engine
from .loading import compile_policy
from .loggate import LogGate
from .models import Policy, QuotaUsage
from .values import Check, CompiledPolicy

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
    one query (the saver's pending usage counts too, being newer than the database)."""
    starts = {
        (check.policy.id, check.subject.key): check.policy.plugin.span(check.policy, now_ms)[0] for check in checks
    }
    query = Q()
    for (policy_id, subject), start in starts.items():
        query |= Q(policy_id=policy_id, subject=subject, period_start=as_stored(start))
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
        pending = saver.pending_used(key[0], key[1], start, generations[key[0]])
        if pending > used:
            found[key] = (start, pending)
    return found


# --- saving usage ------------------------------------------------------------------------------------


class Usage(NamedTuple):
    display: str
    used: int
    generation: int  # the policy's when counted: a reset of every subject makes earlier counts stale
    limit: int | None = None  # the subject's limit when counted (a plan's, an override's): billing reads it


KEPT_WHILE_REFUSED = 100_000  # subjects' usage a worker keeps unsaved while the database refuses it (~40 MB)


class Saver:
    """Usage to upsert, by (policy id, subject key, period start ms): the largest count seen wins, here
    and in the database (every worker sends what it saw; a count only grows within a period)."""

    def __init__(self) -> None:
        self._pending: dict[tuple[int, str, int], Usage] = {}
        self._lock = threading.Lock()
        self._saving = threading.Lock()
        self._timer: threading.Timer | None = None
        self._refused = False  # the last save failed: what waits is bounded until one succeeds

    def record(
        self, policy: CompiledPolicy, subject_key: str, display: str, start_ms: int, used: int, limit: int | None = None
    ) -> None:
        key = (policy.id, subject_key, start_ms)
        with self._lock:
            known = self._pending.get(key)
            if known is None and self._refused and len(self._pending) >= KEPT_WHILE_REFUSED:
                pass  # the database is away: Redis still holds the count, the backup of it is bounded
            elif known is None or (known.generation, known.used) < (policy.generation, used):
                self._pending[key] = Usage(display, used, policy.generation, limit)
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

    def pending_used(self, policy_id: int, subject_key: str, start_ms: int, generation: int) -> int:
        known = self._pending.get((policy_id, subject_key, start_ms))
        return known.used if known and known.generation >= generation else 0

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
        """Upsert what is pending, all or nothing; how many rows. What the database refuses is kept (bounded)
        and saved on the timer once it answers again: a save runs until nothing waits."""
        with self._saving:
            with self._lock:
                pending, self._pending, self._timer = self._pending, {}, None
            if not pending:
                return 0
            try:
                _upsert(pending)
            except Exception as error:  # noqa: BLE001 - whatever the database raised, the usage is kept for later
                logger.warning("ratelimit: quota usage could not be saved yet: %s", error)
                self._keep(pending)
                return 0
            self._refused = False
            return len(pending)

    def _keep(self, pending: dict[tuple[int, str, int], Usage]) -> None:
        """Put back a batch the database refused, under what was counted since, and save it again on the timer."""
        with self._lock:
            self._refused = True
            for key, usage in pending.items():
                known = self._pending.get(key)
                if known is None and len(self._pending) >= KEPT_WHILE_REFUSED:
                    continue
                if known is None or (known.generation, known.used) < (usage.generation, usage.used):
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


BATCH = 500  # rows per INSERT


def _upsert(pending: dict[tuple[int, str, int], Usage]) -> None:
    """INSERT ... ON CONFLICT keeping the larger count (what several workers saw of one period)."""
    alias = router.db_for_write(QuotaUsage)
    connection = connections[alias]
    table = connection.ops.quote_name(QuotaUsage._meta.db_table)
    larger = {"postgresql": "GREATEST", "mysql": "GREATEST"}.get(connection.vendor, "MAX")
    now = django_timezone.now()  # what auto_now writes, naive with USE_TZ False
    # a policy deleted meanwhile takes its usage with it; counts from before a reset of every subject are stale
    generations = dict(
        Policy.objects.using(alias).filter(pk__in={key[0] for key in pending}).values_list("pk", "generation")
    )
    rows = [
        (policy_id, subject, usage.display[:100], as_stored(start), usage.used, usage.limit, now)
        for (policy_id, subject, start), usage in pending.items()
        if usage.generation >= generations.get(policy_id, usage.generation + 1)
    ]
    limit = connection.ops.quote_name("limit")  # a reserved word in SQL
    columns = f"policy_id, subject, display, period_start, used, {limit}, updated"
    # the limit of the latest save: a plan changed within the period bills by the one in force at its end
    if connection.vendor == "mysql":
        conflict = (
            "ON DUPLICATE KEY UPDATE used = GREATEST(used, VALUES(used)), display = VALUES(display), "
            f"{limit} = COALESCE(VALUES({limit}), {limit}), updated = VALUES(updated)"
        )
    else:
        conflict = (
            "ON CONFLICT (policy_id, subject, period_start) DO UPDATE SET "
            f"used = {larger}({table}.used, excluded.used), display = excluded.display, "
            f"{limit} = COALESCE(excluded.{limit}, {table}.{limit}), updated = excluded.updated"
        )
    # one transaction: a batch the database refuses half-way is kept whole and saved again, none of it twice
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        for first in range(0, len(rows), BATCH):
            batch = rows[first : first + BATCH]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(batch))
            params = [
                connection.ops.adapt_datetimefield_value(value) if isinstance(value, datetime) else value
                for row in batch for value in row
            ]
            cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {values} {conflict}", params)


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
engine.hooks.counted, engine.hooks.saved_usage = saver.record, saved
