"""Counts in buckets of one hash per subject: smooth at window edges, memory bounded by the bucket count."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from ..rates import MAX_WINDOW
from .base import TOTALS_BUCKETS, Strategy

MAX_BUCKETS = 60  # default bucket count
BUCKET_CEILING = 600  # more buckets make every decision sum too many fields


def default_bucket_size(window: int) -> int | None:
    """The smallest bucket that divides the window into 2 to MAX_BUCKETS buckets, else into the fewest
    buckets up to BUCKET_CEILING (a prime window); None when no whole second fits (a 1 s window)."""
    # tries bucket counts, not sizes: at most BUCKET_CEILING steps whatever the window
    counts = [count for count in range(2, min(window, BUCKET_CEILING) + 1) if window % count == 0]
    if not counts:
        return None
    within = [count for count in counts if count <= MAX_BUCKETS]
    return window // (within[-1] if within else counts[0])


class SlidingWindow(Strategy):
    name = "sliding_window"
    label = "Sliding window (buckets)"
    help = "counts in buckets, smooth and bounded memory."
    letter = "s"
    order = 2
    reference = "tests/test_strategies_property.py::SlidingWindow"
    counts_units = True  # tokens, content-bytes: a settle moves its count (settling)
    default = True
    options = {"bucket_size": (
        "width of one bucket in seconds; must divide the window, e.g. 10 for a 60 second window. Blank picks "
        "the smallest size giving at most 60 buckets."
    )}

    def settling(self, policy, limit: int, at_ms: int) -> tuple[str, int, int]:
        return "s", at_ms // policy.bucket_ms, 0  # the bucket the estimate was counted in

    def clean(self, row) -> None:
        window, size = row.window, row.bucket_size
        if not window or window < 1 or window > MAX_WINDOW or (size is not None and size < 1):
            return  # the window or bucket size field reports its own error
        suggested = default_bucket_size(window)
        if size is None:
            row.bucket_size = suggested  # None for a 1 s window: it gets buckets of 100 ms
        elif window % size:
            raise ValidationError({"bucket_size": (
                f"The bucket size must divide the window: {size} does not divide {window}. "
                f"Try {suggested or 'leaving it blank'}."
            )})
        elif size * 2 > window:
            raise ValidationError({"bucket_size": (
                f"The bucket size can be at most half the window ({window // 2} s here): a bucket of {size} s "
                f"makes it a fixed window that admits twice the limit at its edge. Try "
                f"{suggested or 'leaving it blank'}, or choose another strategy."
            )})
        elif window // size > BUCKET_CEILING:
            raise ValidationError({"bucket_size": (
                f"{window // size} buckets is too many (at most {BUCKET_CEILING}): use a bucket of at least "
                f"{-(-window // BUCKET_CEILING)} seconds."
            )})

    def bucket_ms(self, row) -> int:
        return row.bucket_size * 1000 if row.bucket_size else row.window * 100  # a 1 s window: 10 of 100 ms

    def shape(self, row, bucket_ms: int) -> str:
        return f"{self.letter}{row.window}/" + (f"{row.bucket_size}" if row.bucket_size else f"{bucket_ms}ms")

    def totals_bucket_ms(self, window_ms: int, bucket_ms: int) -> int:
        # the policy's own buckets, grouped when there are over 60
        buckets = window_ms // bucket_ms
        return next(window_ms // count for count in range(min(buckets, TOTALS_BUCKETS), 0, -1) if buckets % count == 0)

    def live_batch(self, policy, batch: int, field_budget: int) -> int:
        buckets = policy.window_ms // policy.bucket_ms  # a counter may read half of them
        return max(1, min(batch, field_budget // (5 + buckets // 2)))


STRATEGY = SlidingWindow()
