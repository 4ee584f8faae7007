"""One counter per subject and window: the cheapest; a client may get twice the limit across a window edge."""

from __future__ import annotations

from .base import Strategy

PACK = 1000000  # lua/fixed_window.lua: a counter holds count * PACK + the number of its window


class FixedWindow(Strategy):
    name = "fixed_window"
    label = "Fixed window"
    help = "one counter per window, cheapest, allows bursts at window edges."
    letter = "f"
    order = 1
    reference = "tests/test_strategies_property.py::FixedWindow"
    counts_units = True  # tokens, content-bytes: a settle moves its count (settling)
    whole_windows = True
    counts_like = ("django-ratelimit",)  # a cache counter per window

    def shape(self, row, bucket_ms: int) -> str:
        # 'w': a counter that exists is the current window's (it ends with its window); the counters of
        # earlier versions ('f') outlived their window by a second, so they are never read as these
        return f"w{row.window}"

    def settling(self, policy, limit: int, at_ms: int) -> tuple[str, int, int]:
        return "p", at_ms // policy.window_ms % PACK, 0  # lua/fixed_window.lua keeps the window's number

    def totals_bucket_ms(self, window_ms: int, bucket_ms: int) -> int:
        return window_ms  # the totals count what the counters count: one window


STRATEGY = FixedWindow()
