"""Rate strings: '5/s', '100/m', '1000/h', '10/5m', and DRF's and django-ratelimit's spellings ('5/min',
'100/hour', '1000/day', '100/10s', '100/10'), read as (limit, window in seconds) and written back."""

from __future__ import annotations

import re

from .values import REQUESTS

UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}
RATE = re.compile(r"^\s*(?P<limit>\d+)\s*/\s*(?P<count>\d*)\s*(?P<unit>[a-z]*)\s*$", re.IGNORECASE)
EXAMPLES = "e.g. 5/s, 100/m, 1000/h, 10/5m, 100/day"
MAX_WINDOW = 366 * 86400  # seconds: checked here, before anything computes with the window
DIGITS = 18  # more digits than any limit or window can have: refused before int() reads them


def parse_rate(rate: str | tuple[int, int]) -> tuple[int, int]:
    """'10/5m' -> (10, 300). A bare number of seconds after the slash is allowed ('100/10' -> (100, 10)).

    Raises ValueError with a message that says what is wrong. A limit of 0 is returned as is: callers
    that store a policy refuse it, django-ratelimit's '0/m' means "always limited".
    """
    if isinstance(rate, tuple) and len(rate) == 2 and all(isinstance(part, int) for part in rate):
        return _checked(*rate, shown=repr(rate))
    if not isinstance(rate, str):
        raise ValueError(f"A rate is a string such as '5/m', not {type(rate).__name__} {rate!r}.")
    match = RATE.match(rate)
    if match is None:
        raise ValueError(f"{_shown(rate)} is not a rate: write <requests>/<period>, {EXAMPLES}.")
    unit = match["unit"].lower()
    if unit and unit not in UNITS and _calendar_word(unit):
        raise ValueError(
            f"{_shown(rate)}: unknown period {match['unit']!r} for a window of seconds (s, m, h or d). A calendar "
            f"quota is written 10000/month, 500/week or 1000/calendar-day, where quotas are taken: @ratelimit, "
            f"RATELIMIT_POLICIES, the admin and the import."
        )
    if unit and unit not in UNITS:
        raise ValueError(
            f"{_shown(rate)}: unknown period {match['unit']!r}; a window of seconds is written with s, m, h or d "
            f"(or sec, min, hour, day), {EXAMPLES}; a calendar quota with week, month or calendar-day "
            f"(500/week, 10000/month, 1000/calendar-day), where quotas are taken: @ratelimit, RATELIMIT_POLICIES, "
            f"the admin and the import."
        )
    if not unit and not match["count"]:
        raise ValueError(f"{_shown(rate)} has no period after the slash: {EXAMPLES}.")
    if len(match["limit"]) > DIGITS:
        raise ValueError(f"{_shown(rate)}: the number of requests is too large.")
    if len(match["count"]) > DIGITS:
        raise ValueError(_too_long(_shown(rate)))
    window = int(match["count"] or 1) * UNITS.get(unit or "s")
    return _checked(int(match["limit"]), window, shown=_shown(rate))


QUOTA = re.compile(
    r"^\s*(?P<limit>\d{1,18})\s*/\s*(?P<period>calendar[-_ ]?day|(?:calendar[-_ ]?)?week|(?:calendar[-_ ]?)?month)\s*$",
    re.IGNORECASE,
)


def parse_quota(rate: object) -> tuple[int, str] | None:
    """'10000/month' -> (10000, 'month'), '500/week' (ISO, from Monday), '1000/calendar-day' -> a
    calendar period; None for any other rate ('1000/day' is a window of 86,400 seconds)."""
    match = QUOTA.match(rate) if isinstance(rate, str) else None
    if match is None:
        return None
    period = match["period"].lower()
    return int(match["limit"]), next(name for name in ("day", "week", "month") if period.endswith(name))


def _calendar_word(unit: str) -> bool:
    """'month', 'weeks', 'mo', 'w': a calendar period written where a window of seconds was expected."""
    return unit in ("w", "wk", "wks", "mo", "mos", "mon") or unit.rstrip("s") in ("week", "month", "calendar")


def not_a_period(rate: str) -> str:
    """Why a rate of seconds ('100/m') is refused for a calendar quota, which would count it per its period."""
    return (
        f"{_shown(rate)} is a window of seconds, which a calendar quota does not count: write a calendar rate "
        "such as 100/month, or choose another strategy."
    )


def _shown(rate: str) -> str:
    """The rate as messages quote it: a long one cut, so an error never echoes a megabyte back."""
    return repr(rate if len(rate) <= 40 else rate[:37] + "...")


def _checked(limit: int, window: int, shown: str) -> tuple[int, int]:
    if limit < 0:
        raise ValueError(f"{shown}: the number of requests cannot be negative.")
    if window < 1:
        raise ValueError(f"{shown}: the period must be at least 1 second.")
    if window > MAX_WINDOW:
        raise ValueError(_too_long(shown))
    return limit, window


def _too_long(shown: str) -> str:
    return f"{shown}: the period can be at most one year (366d, {MAX_WINDOW} seconds)."


def format_rate(limit: int, window: int) -> str:
    """(5, 60) -> '5/m', (10, 300) -> '10/5m', (7, 90) -> '7/90s': the shortest string parse_rate reads back."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        if window % size == 0:
            count = window // size
            return f"{limit}/{'' if count == 1 else count}{unit}"
    return f"{limit}/{window}s"  # unreachable: every window divides by 1


def human_per(window: int, period: str = "", time_zone: str = "") -> str:
    """What a limit counts over, as people read it: '1 min', or a calendar quota's 'calendar month (UTC)'
    (not its window, the longest period: '31 d' would say a month is 31 days from the first request)."""
    if not period:
        return human_window(window)
    return f"calendar {period} ({time_zone})" if time_zone else f"calendar {period}"


def human_window(seconds: int) -> str:
    """60 -> '1 min', 3600 -> '1 h', 90 -> '90 s'."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"



def figure(number: int, unit: str = REQUESTS) -> str:
    """A number of a policy's units as the operator's pages show it: requests as they are written ('1000'),
    a metered unit's larger figures grouped ('7,412,009')."""
    return str(number) if unit == REQUESTS else f"{number:,}"


def quantity(number: int, unit: str = REQUESTS) -> str:
    """7412009 tokens -> '7,412,009 tokens', 1 token -> '1 token', 5 requests -> '5 requests'."""
    named = unit[:-1] if number == 1 and unit.endswith("s") else unit
    return f"{number:,} {named}"


def amount(number: int, unit: str = REQUESTS) -> str:
    """A number of a policy's units where requests, the default unit, go unsaid: '5', '9,000 tokens'."""
    return str(number) if unit == REQUESTS else quantity(number, unit)


def human_limit(limit: int, unit: str, per: str) -> str:
    """A limit as the admin's list, the tester and the CLI show it: '100 / 1 min',
    '10,000,000 tokens / calendar month (UTC)'."""
    return f"{amount(limit, unit)} / {per}"


def human_usage(used: int, limit: int, unit: str, window: int, period: str = "") -> str:
    """What a subject used of a limit, as a customer reads it: '7,412,009 / 10,000,000 tokens this month',
    '41 / 100 requests per 1 min'."""
    span = "today" if period == "day" else f"this {period}" if period else f"per {human_window(window)}"
    return f"{used:,} / {quantity(limit, unit)} {span}"
