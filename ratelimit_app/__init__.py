"""Rate limits for Django, configured as data and enforced in one Redis round trip.

For code that is not a view: `ratelimit_app.check(request, action)` tells what would happen
without counting; `ratelimit_app.hit(request, action)` counts the request. Both take `cost=N` for a
request worth N units (the admin's cost for the action wins) and return a Verdict;
`acheck` and `ahit` are the same for async code. `ratelimit_app.settle(request, tokens=1834)`
(`asettle`) says what a request of a metered policy really used, once the view knows.
`ratelimit_app.usage(request)` (`ausage`) lists the caller's quotas and rate limits;
`ratelimit_app.subject_key(policy, subject)` finds a subject's rows of saved usage.
`ratelimit_app.ratelimit` is the view decorator.
"""

from __future__ import annotations

__version__ = "0.3.0"  # the one version source: pyproject.toml reads it

from .values import Unavailable  # noqa: E402  (hit(), check() and usage() raise it: see their docs)


def __getattr__(name: str):
    # the decorator imports Django's machinery: loaded when asked for, not with the package
    if name == "ratelimit":
        from .decorators import ratelimit

        return ratelimit
    raise AttributeError(f"module 'ratelimit_app' has no attribute {name!r}")


def check(request, action: str, cost=None):
    """What would happen to `request` (of `cost` units) under the policies of `action`, counting nothing: a Verdict."""
    from .actions import check as check_action

    return check_action(request, action, cost)


def hit(request, action: str, cost=None):
    """Count `request` under the policies of `action` not decided yet for it, taking `cost` units
    (a number or a function of the request; None: 1): a Verdict (`.allowed`)."""
    from .actions import hit as hit_action

    return hit_action(request, action, cost)


async def acheck(request, action: str, cost=None):
    """check() for async code."""
    from .actions import acheck as acheck_action

    return await acheck_action(request, action, cost)


async def ahit(request, action: str, cost=None):
    """hit() for async code."""
    from .actions import ahit as ahit_action

    return await ahit_action(request, action, cost)


def settle(request, **used):
    """Say what `request` really used of a metered unit, once the view knows: `settle(request, tokens=1834)`.
    It was admitted on its estimate (its cost); its policies in that unit are charged the difference as it ends."""
    from .metering import settle as settle_usage

    settle_usage(request, **used)


async def asettle(request, **used):
    """settle() for async code."""
    from .metering import asettle as asettle_usage

    await asettle_usage(request, **used)


def usage(request):
    """The caller's usage of every limit that applies to them (used, limit, remaining, resets at), for
    a customer's dashboard or an `/api/usage` view; counts nothing. Only the caller's own: policies keyed
    by `ip`, `user`, `user_or_ip`, a header not in RATELIMIT_PLAIN_HEADERS (an API key), a key function
    marked `identifies_caller = True`, or a composite of these; never `param:`, `get:`, `post:`, `global`."""
    from .caller_usage import usage as usage_of

    return usage_of(request)


async def ausage(request):
    """usage() for async code."""
    from .caller_usage import ausage as ausage_of

    return await ausage_of(request)


def subject_key(policy: str, subject: str) -> str:
    """The key of a subject written as a person would (`header:X-Api-Key=sk_live_...`, `user:alice`,
    `ip:203.0.113.7`) under the policy named `policy`: what the quota usage export's `subject_key`
    column holds, to find a customer's rows when their subject is shown masked. ValueError when there
    is no such policy or the subject does not fit its key."""
    from .operations import subject_key_for

    return subject_key_for(policy, subject)
