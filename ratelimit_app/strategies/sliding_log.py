"""One sorted-set entry per admitted request: exact at every instant; memory grows with the limit."""

from __future__ import annotations

from .base import Strategy


class SlidingLog(Strategy):
    name = "sliding_log"
    label = "Sliding log (exact)"
    help = "one entry per request, exact, memory grows with the limit."
    letter = "l"
    order = 3
    reference = "tests/test_strategies_property.py::Model"
    most = 10_000  # a member a unit: one request's units are written in bounded time
    unit_refusal = "it keeps one entry per unit, which thousands of tokens or bytes a request would grow without bound"
    counts_like = ("drf",)  # DRF's throttles keep the times of the requests in the window

    def live_batch(self, policy, batch: int, field_budget: int) -> int:
        return batch // 2  # two sorted-set reads a counter: its count and its newest request


STRATEGY = SlidingLog()
