"""Requests in flight: a place per request while it runs, given back when the request ends."""

from __future__ import annotations

from .base import Strategy


class Concurrency(Strategy):
    name = "concurrency"
    label = "Concurrency (requests in flight)"
    help = (
        "at most `limit` requests of a subject in progress at once: a place is taken when a request is "
        "admitted and given back when its response is done; the window is a lease (see window)."
    )
    letter = "c"
    order = 5
    reference = "tests/test_strategies_property.py::InFlight"
    holds = True
    unit_refusal = "it counts the requests in progress (places given back when each ends), not what they used"
    most = 10_000  # a member a place: one request's places are written (and given back) in bounded time
    notes = {
        "limit": "requests in progress at once",
        "window": "the lease: a request still running after it stops counting (a killed worker frees its place then)",
    }

    def shape(self, row, bucket_ms: int) -> str:
        # not the window: a new lease length must not forget the requests running under the old one
        return self.letter

    def live_batch(self, policy, batch: int, field_budget: int) -> int:
        return batch // 2  # two sorted-set reads a counter: its count and its last lease


STRATEGY = Concurrency()
