"""A count per calendar day, ISO week or month in a time zone: one counter per subject that ends with
its period, the usage also saved to the database (a period Redis lost starts from what was saved).

The plug-in whole: the periods a decision sends (by this worker's clock, beside lua/calendar_quota.lua),
when a period ends, what a reset writes. The saved usage is the upper layer's (quotas.py), reached by the
engine through its hooks."""

from __future__ import annotations

import zlib

from django.conf import settings
from django.core.exceptions import ValidationError

from ..lru import BoundedCache, size_of
from ..periods import LABELS, PERIODS, Periods, periods_at, zone
from .base import Strategy

PACK = 1000000  # lua/calendar_quota.lua: a counter holds count * PACK + the number of its period

# (period, zone) -> the periods around the last instant asked, and their text in a quota's terms
_periods = BoundedCache("ratelimit_app.strategies.periods", lambda key, found: size_of(key, *key, found, *found))


def _current(policy, now_ms: int) -> tuple[Periods, str]:
    """The periods of a calendar quota around `now_ms` and their text, worked out again only when a period ends."""
    found = _periods.get((policy.period, policy.time_zone))
    if found is None or not found[0].start <= now_ms < found[0].end:
        at = periods_at(policy.period, zone(policy.time_zone), now_ms)
        text = f"{at.previous:x},{at.start:x},{at.end:x},{at.after:x}"
        found = _periods.put((policy.period, policy.time_zone), (at, text))
    return found


def _number(start_ms: int) -> int:
    """A period's number in its counter, from its start, as lua/calendar_quota.lua's number() (never 0)."""
    return start_ms // 60000 % (PACK - 1) + 1


def periods(policy, now_ms: int) -> Periods:
    """The periods of a calendar quota (a compiled policy) around `now_ms`."""
    return _current(policy, now_ms)[0]


class Quota(Strategy):
    name = "calendar_quota"
    label = "Calendar quota (day, week, month)"
    help = (
        "a count per calendar day, week or month in a time zone, that starts again when the next one begins; "
        "saved to the database too."
    )
    letter = "q"
    order = 6
    reference = "tests/test_quotas.py::test_the_quota_strategy_decides_as_the_calendar_does"
    counts_units = True  # tokens, content-bytes: a settle moves its count (settling)
    options = {
        "period": "the calendar period counted: a day, a week (ISO, from Monday) or a month, e.g. month.",
        "time_zone": "where the period's days begin, e.g. Europe/Paris; blank: the site's TIME_ZONE.",
    }
    notes = {"window": "set from the period (its longest length), whatever is entered"}
    asked = True

    def settling(self, policy, limit: int, at_ms: int) -> tuple[str, int, int]:
        # as lua/calendar_quota.lua's number(): the period's number, from its start (never 0)
        return "p", _number(self.span(policy, at_ms)[0]), 0

    def clean(self, row) -> None:
        if row.period not in PERIODS:
            raise ValidationError({"period": "A calendar quota counts per day, week or month: choose one."})
        row.window = PERIODS[row.period]

    def shape(self, row, bucket_ms: int) -> str:
        # a change of period or zone starts fresh counters (the saved usage is kept by period start)
        return f"q{row.period[0]}{zlib.crc32((row.time_zone or '-').encode()) % 1679616:x}"

    def period_kind(self, row) -> tuple[str, str]:
        return row.period, row.time_zone or settings.TIME_ZONE or "UTC"

    def counts_over(self, row) -> str | None:
        if row.period not in LABELS:
            return None
        return f"{LABELS[row.period]} ({row.time_zone or settings.TIME_ZONE})"

    def terms(self, policy, now_ms: int, seed: tuple[int, int] | None) -> str:
        # the `bucket` of lua/calendar_quota.lua: its periods, and the saved usage when asked again, in hex
        # (the Lua half reads hex without strtod)
        text = _current(policy, now_ms)[1]
        return text if seed is None else f"{text},{seed[0]:x},{seed[1]:x}"

    def span(self, policy, at_ms: int) -> tuple[int, int]:
        found = _current(policy, at_ms)[0]
        return found.start, found.end

    def starts_again(self, policy, now_ms: int) -> int | None:
        return _current(policy, now_ms)[0].end

    def emptied(self, policy, now_ms: int) -> tuple[str, int] | None:
        # a counter of the current period that has counted nothing: one deleted instead would read as lost,
        # and the next request would take the saved usage back (the Lua half numbers a period as here, never 0)
        found = _current(policy, now_ms)[0]
        return str(_number(found.start)), found.end


STRATEGY = Quota()
