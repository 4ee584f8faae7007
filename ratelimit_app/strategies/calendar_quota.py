"""A count per calendar day, ISO week or month in a time zone: one counter per subject that ends with
its period, the usage also saved to the database (a period Redis lost starts from what was saved)."""

from __future__ import annotations

import zlib

from django.core.exceptions import ValidationError

from ..periods import PERIODS
from .base import Strategy


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
    options = {
        "period": "the calendar period counted: a day, a week (ISO, from Monday) or a month, e.g. month.",
        "time_zone": "where the period's days begin, e.g. Europe/Paris; blank: the site's TIME_ZONE.",
    }
    notes = {"window": "set from the period (its longest length), whatever is entered"}

    def clean(self, row) -> None:
        if row.period not in PERIODS:
            raise ValidationError({"period": "A calendar quota counts per day, week or month: choose one."})
        row.window = PERIODS[row.period]

    def shape(self, row, bucket_ms: int) -> str:
        # a change of period or zone starts fresh counters (the saved usage is kept by period start)
        return f"q{row.period[0]}{zlib.crc32((row.time_zone or '-').encode()) % 1679616:x}"


STRATEGY = Quota()
