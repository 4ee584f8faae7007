"""A strategy this site does not have, registered by tests (before the models are built, or at run time)."""

from __future__ import annotations

from ratelimit_app import strategies
from ratelimit_app.strategies.base import Strategy


class Leaky(Strategy):
    """With an option and a note of its own: both change the help texts the registry gives."""

    name = "leaky_bucket"
    label = "Leaky bucket"
    help = "a queue drained at a steady rate."
    letter = "k"
    order = 7
    options = {"burst": "requests queued before one is refused, e.g. 20."}
    notes = {"limit": "requests drained per window"}

    @property
    def lua(self) -> str:
        return strategies.get(strategies.DEFAULT).lua  # a Lua half borrowed: no test decides with it


# A Lua half on the contract of lua/contract.lua, and one on the contract before it (peek, take, undo,
# reset: lua/concurrency.lua spoke it until it was ported), for strategies the registry is asked to load.
CURRENT = """
do
  strategies.scratch = {
    look = function(key, limit, terms, cost) return 0, 0, 0, 1 end,
    charge = function(key, limit, terms, cost) return true, 0, 0, 0, -1, nil end,
    refund = function(key, state, cost) end,
  }
end
"""
EARLIER = """
do
  strategies.scratch = {
    peek = function(key, now, window, bucket, limit, now_us, cost) return 0, 0, nil end,
    reset = function(key, now, window, bucket, count, state) return 0 end,
    take = function(key, now, window, bucket, limit, now_us, totals_bucket, cost, lease)
      return 0, 0, nil, nil, true, window, nil
    end,
    undo = function(key, now, state) end,
  }
end
"""


class Scratch(Strategy):
    """A strategy that loads: its own letter, a reference model, a Lua half on the current contract.
    Tests change one of these at a time to see the registry refuse it."""

    name = "scratch"
    label = "Scratch"
    help = "counts nothing."
    letter = "z"
    order = 9
    reference = "tests/test_strategies.py::test_a_scratch_strategy_that_can_count_is_loaded"
    source = CURRENT

    def script(self) -> str:
        return self.source
