"""settle(): what a request really used of a metered unit (tokens, credits), told once the view knows it.
The request was admitted on its estimate (its cost); its metered policies are charged the difference as it
ends, with what its closing step sends anyway. `content-bytes` settles itself from the response."""

from __future__ import annotations

from .closing import ignore_settle
from .doors import STATE_ATTRIBUTE
from .models import MAX_COST
from .models.validators import UNIT, UNIT_LENGTH
from .subjects import http_request
from .values import REQUESTS


def settle(request, **used: int) -> None:
    """Say what `request` used of each metered unit: `settle(request, tokens=1834)` (a unit with a hyphen
    is written with an underscore: `gpu_seconds=3`). Once per unit and request, before it ends: in the view,
    or in a streamed body before its last chunk. Nothing is sent now; its policies in that unit are charged
    the difference from its estimate when it ends.

    Ignored where nothing was charged in that unit: a request no policy in the unit applied to (or none
    enabled), one refused, or one never decided. Ignored too, with an error logged, what only the request's
    run tells (never a 500 for it): an amount below 0 or above 2147483647 (its estimate stands), a unit
    settled again (its first settle stands). TypeError or ValueError, saying why, for an amount that is not
    a whole number, a name that is no unit, the unit 'requests', or a request that has ended."""
    amounts = _amounts(used)
    if not amounts:
        return
    state = http_request(request).__dict__.get(STATE_ATTRIBUTE)
    if state is not None and state.closing is not None:
        state.closing.settle(amounts)


async def asettle(request, **used: int) -> None:
    """settle() for async code (it sends nothing itself: the request's end does)."""
    settle(request, **used)


def _amounts(used: dict[str, object]) -> dict[str, int]:
    if not used:
        raise TypeError("settle() needs what the request used, by unit: settle(request, tokens=1834).")
    amounts = {}
    for name, amount in used.items():
        unit = name.replace("_", "-")
        if not UNIT.fullmatch(unit) or len(unit) > UNIT_LENGTH:
            raise ValueError(f"settle(): {name!r} is not a unit (a unit is lower case, e.g. tokens or credits).")
        if unit == REQUESTS:
            raise ValueError(
                "settle(): requests are counted before the view, by the request's cost; settle a metered unit "
                "(tokens, credits, content-bytes), which its policy declares."
            )
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"settle(): {name} must be a whole number of units, not {amount!r}.")
        if not 0 <= amount <= MAX_COST:
            ignore_settle("range", f"settle(): {name}={amount} is out of range: from 0 to {MAX_COST} units a "
                          "request; ignored, the request's estimate stands.")
            continue
        amounts[unit] = amount
    return amounts
