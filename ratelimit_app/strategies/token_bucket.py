"""GCRA: one arrival time per subject; the limit per window as a steady rate, plus a burst at once."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from ..rates import MAX_WINDOW
from .base import Strategy

MAX_RATE = 1_000_000  # per second: requests are spaced in whole microseconds


class TokenBucket(Strategy):
    name = "token_bucket"
    label = "Token bucket (GCRA, with a burst)"
    help = "the limit per window as a steady rate plus a burst at once (GCRA), exact, smooth, one integer per subject."
    letter = "t"
    order = 4
    reference = "tests/test_token_bucket.py::test_decisions_match_the_reference_model"
    counts_units = True  # tokens, content-bytes: a settle moves its count (settling)
    options = {"burst": (
        "requests allowed at once, at most the limit; after them, one request every window / limit. E.g. "
        "limit 10, window 60, burst 10 (or blank): burst 10, then 1 request every 6 s; burst 2: 2 at once, "
        "then 1 every 6 s. Blank means the limit."
    )}
    live_per_key = True  # a subject's count depends on its rate, so on the limit in effect for it

    def clean(self, row) -> None:
        limit, window, burst = row.limit, row.window, row.burst
        if not limit or not window or limit < 1 or window < 1:
            return  # the limit and window fields report their own errors
        if limit > window * MAX_RATE:
            raise ValidationError({"limit": (
                f"A token bucket admits at most {MAX_RATE:,} requests per second: with a window of {window} s "
                f"the limit can be at most {window * MAX_RATE:,}."
            )})
        if burst and burst > limit:
            # so that a bucket refills within its window, which the live page and the totals are counted in
            message = f"The burst can be at most the limit ({limit}): a token bucket refills within its window."
            times = -(-burst // limit)
            if window * times <= MAX_WINDOW:
                message += (
                    f" For the same rate with a burst of {burst}, write a limit of {limit * times} "
                    f"per {window * times} s."
                )
            raise ValidationError({"burst": message})

    def settling(self, policy, limit: int, at_ms: int) -> tuple[str, int, int]:
        # as lua/token_bucket.lua's sizes(): the interval per unit (us, rounded up) and the capacity
        return "t", -(-policy.window_ms * 1000 // limit), policy.capacity(limit)

    def burst(self, row) -> int | None:
        return row.burst

    def bucket_ms(self, row) -> int:
        return row.burst or 0  # the Lua half reads the burst there (0: the limit)

    def shape(self, row, bucket_ms: int) -> str:
        # its one value is a time, right under any rate: a new limit, window or burst keeps it (and the key short)
        return self.letter


STRATEGY = TokenBucket()
