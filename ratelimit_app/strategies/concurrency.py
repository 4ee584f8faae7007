"""Requests in flight: a place per request while it runs, given back when its response is done."""

from __future__ import annotations

from .base import Strategy


class Concurrency(Strategy):
    name = "concurrency"
    label = "Concurrency (requests in flight)"
    help = (
        "at most `limit` requests of a subject in progress at once; a place is taken when a request is "
        "admitted and given back when its response is done. Here the window is a lease: a request still "
        "running after it stops counting, so a killed worker never locks a subject out for longer."
    )
    letter = "c"
    order = 5
    holds = True

    def live_batch(self, policy, batch: int, field_budget: int) -> int:
        return batch // 2  # two sorted-set reads a counter: its count and its last lease


STRATEGY = Concurrency()
