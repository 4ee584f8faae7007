"""Calendar periods (a day, an ISO week from Monday, a month) in a time zone, as instants in ms: where
one starts and ends, with months of their real length and days of 23 or 25 hours across DST."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .lru import byte_bounded_cache

PERIODS = {"day": 86400, "week": 7 * 86400, "month": 31 * 86400}  # a policy's window: the longest period
LABELS = {"day": "calendar day", "week": "calendar week (ISO, from Monday)", "month": "calendar month"}


class Periods(NamedTuple):
    """The period containing an instant and its neighbours, in ms: [previous, start) [start, end) [end, after)."""

    previous: int
    start: int
    end: int
    after: int


def zone(name: str) -> ZoneInfo:
    """The time zone called `name` (ValueError, saying so, for one that does not exist)."""
    return _zone(name)


@byte_bounded_cache(max_chars=64)  # zone names; a ZoneInfo is shared by zoneinfo itself
def _zone(name: str) -> ZoneInfo:
    if not name or name != name.strip() or name.startswith(("/", ".")) or ".." in name:
        raise ValueError(f"{name!r} is not a time zone: use a name such as 'Europe/Paris' or 'UTC'.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as error:
        raise ValueError(f"{name!r} is not a time zone: use a name such as 'Europe/Paris' or 'UTC'.") from error


def _first_day(period: str, day: date) -> date:
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise ValueError(f"{period!r} is not a calendar period: use day, week or month.")


def _next_first_day(period: str, first: date) -> date:
    if period == "day":
        return first + timedelta(days=1)
    if period == "week":
        return first + timedelta(days=7)
    return date(first.year + first.month // 12, first.month % 12 + 1, 1)


def _previous_first_day(period: str, first: date) -> date:
    return _first_day(period, first - timedelta(days=1))


def _midnight_ms(day: date, tz: ZoneInfo) -> int:
    """The instant a local date begins: its first midnight (fold 0), or when the clocks jumped past it."""
    return round(datetime.combine(day, time(0), tzinfo=tz).timestamp() * 1000)


def periods_at(period: str, tz: ZoneInfo, now_ms: int) -> Periods:
    """The period of `period` kind that contains the instant `now_ms` in zone `tz`, and its neighbours."""
    local = datetime.fromtimestamp(now_ms / 1000, tz).date()
    first = _first_day(period, local)
    start = _midnight_ms(first, tz)
    if now_ms < start:  # a midnight the clocks skipped: the day began at the jump, which is still before
        first = _previous_first_day(period, first)
        start = _midnight_ms(first, tz)
    following = _next_first_day(period, first)
    end = _midnight_ms(following, tz)
    previous = _midnight_ms(_previous_first_day(period, first), tz)
    return Periods(previous, start, end, _midnight_ms(_next_first_day(period, following), tz))
