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
