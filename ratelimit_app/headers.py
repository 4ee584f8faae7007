"""The IETF RateLimit headers (draft-ietf-httpapi-ratelimit-headers-11) and Retry-After.

    RateLimit-Policy: "search-per-ip";q=5;w=60, "api-per-user";q=1000;w=3600, "report";q=2;qu="concurrent-requests"
    RateLimit: "search-per-ip";r=2;t=41, "api-per-user";r=997;t=3412, "report";r=1;t=0

One item per applicable enforced policy (shadow policies are not shown), keyed by the policy name as a
Structured Field string. Quota units are the draft's default, "requests" (a request of cost N counts N
of them), except for a policy of requests in flight: "concurrent-requests", with no `w` (its window is
a lease, not a period the quota is counted over), and a policy counting response bytes: "content-bytes".
A unit the view settles (tokens) has no `qu`: the draft's registry names only its own units, so `q` and
`r` count it unsaid. No `pk`: a partition key would tell every client how the server tells subjects
apart (an address, a user id) for no decision the client could make with it.
"""

from __future__ import annotations

from math import ceil
from typing import Sequence

from .lru import byte_bounded_cache
from .values import CONTENT_BYTES, Decision


@byte_bounded_cache()  # policy names: a few, on every response
def _quoted(name: str) -> str:
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


@byte_bounded_cache()  # policy names: a few, on every response
def _plain(quoted: str) -> bool:
    """Whether a header value made with this quoted name is what Django's header setter would store as it
    is (printable ASCII): then it is stored without the setter's checks, which cost a header 4.7k instructions."""
    return quoted.isascii() and quoted.isprintable()


def seconds_left(decision: Decision) -> int:
    """`t`: for a decision over its limit, when a request will fit again; otherwise when the quota is back."""
    left = decision.retry_after if decision.exceeded and decision.retry_after is not None else decision.reset_in
    return ceil(left) if left > 0 else 0


def quota(decision: Decision) -> str:
    """`q` and `w`: the limit per window; for a token bucket, its burst and the seconds an empty bucket
    takes to fill (the window when the burst is the limit), so that q per w is the rate either way."""
    return _quota(decision.policy.capacity(decision.limit), decision.window or decision.policy.window, decision.limit)


@byte_bounded_cache(entry_bytes=512)  # three numbers and a short text
def _quota(q: int, window: int, limit: int) -> str:
    return f"q={q};w={-(-q * window // limit)}"


@byte_bounded_cache()  # a few policies and limits, on every response
def _policy_item(name: str, q: int, window: int, limit: int, in_flight: bool, unit: str) -> str:
    if in_flight:
        return f'{_quoted(name)};q={q};qu="concurrent-requests"'
    if unit == CONTENT_BYTES:  # the one metered unit the draft registers
        return f'{_quoted(name)};{_quota(q, window, limit)};qu="content-bytes"'
    return f"{_quoted(name)};{_quota(q, window, limit)}"


def _policy_item_of(d: Decision) -> str:
    policy = d.policy
    return _policy_item(policy.name, policy.capacity(d.limit), d.window or policy.window, d.limit, policy.holds,
                        policy.unit)


def _item_of(d: Decision) -> str:
    return f"{_quoted(d.policy.name)};r={d.remaining};t={seconds_left(d)}"


def retry_after(denied: Sequence[Decision]) -> int | None:
    """Whole seconds, rounded up, never earlier than any denying policy's `t`, at least 1; None when
    the request costs more than a denying policy ever allows (no wait would help)."""
    if any(d.retry_after is None for d in denied):
        return None
    return max([seconds_left(d) for d in denied] + [1])


def apply(response, decisions: Sequence[Decision], denied: Sequence[Decision] = ()) -> None:
    """Set the headers of the enforced policies; shadow policies never show to clients."""
    if len(decisions) == 1:  # most responses: no list to filter or join
        decision = decisions[0]
        if decision.policy.enforce:
            store = getattr(response.headers, "_store", None)
            if type(store) is dict and _plain(_quoted(decision.policy.name)):
                # Django's ResponseHeaders keeps (name, value) by the lowercased name
                store["ratelimit-policy"] = ("RateLimit-Policy", _policy_item_of(decision))
                store["ratelimit"] = ("RateLimit", _item_of(decision))
            else:
                response.headers["RateLimit-Policy"] = _policy_item_of(decision)
                response.headers["RateLimit"] = _item_of(decision)
    else:
        shown = [d for d in decisions if d.policy.enforce]
        if shown:
            response.headers["RateLimit-Policy"] = ", ".join(map(_policy_item_of, shown))
            response.headers["RateLimit"] = ", ".join(map(_item_of, shown))
    wait = retry_after(denied) if denied else None
    if wait is not None:
        response.headers["Retry-After"] = str(wait)
