"""One counter per subject and window: the cheapest; a client may get twice the limit across a window edge."""

from __future__ import annotations

from .base import Strategy


class FixedWindow(Strategy):
    name = "fixed_window"
    label = "Fixed window"
    help = "one counter per window, cheapest, allows bursts at window edges."
    letter = "f"
    order = 1

    def totals_bucket_ms(self, window_ms: int, bucket_ms: int) -> int:
        return window_ms  # the totals count what the counters count: one window


STRATEGY = FixedWindow()
