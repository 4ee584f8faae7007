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

from .lru import BoundedCache, byte_bounded_cache, size_of
from .values import CONTENT_BYTES, CompiledPolicy, Decision


@byte_bounded_cache()  # policy names: a few, on every response
def _quoted(name: str) -> str:
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


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


def _policy_item(policy: CompiledPolicy, limit: int, window: int) -> str:
    """The policy's item of RateLimit-Policy under `limit` (`window`: a calendar period's seconds, 0 for its own)."""
    q = policy.capacity(limit)
    window = window or policy.window
    if policy.holds:
        return f'{_quoted(policy.name)};q={q};qu="concurrent-requests"'
    if policy.unit == CONTENT_BYTES:  # the one metered unit the draft registers
        return f'{_quoted(policy.name)};{_quota(q, window, limit)};qu="content-bytes"'
    return f"{_quoted(policy.name)};{_quota(q, window, limit)}"


def _kept_bytes(key: tuple, kept: tuple) -> int:
    return size_of(key, kept, *kept)


# (policy, limit, window), or the policy under its own limit and window -> (its RateLimit-Policy item, its quoted
# name and ';r=', whether the item is printable ASCII): what every response under it repeats,
# made once (a snapshot of a policy is itself: a reloaded policy makes its own)
kept_items = BoundedCache("ratelimit_app.headers.policy_items", _kept_bytes)
_kept = kept_items.get


def _made(key: object, policy: CompiledPolicy, limit: int, window: int) -> tuple[str, str, bool]:
    item = _policy_item(policy, limit, window)
    # whether Django's header setter would store the item as it is (printable ASCII), told once: checked on the
    # whole value of every response, it cost a policy ~700 instructions (a test per character)
    return kept_items.put(key, (item, f"{_quoted(policy.name)};r=", item.isascii() and item.isprintable()))


def retry_after(denied: Sequence[Decision]) -> int | None:
    """Whole seconds, rounded up, never earlier than any denying policy's `t`, at least 1; None when
    the request costs more than a denying policy ever allows (no wait would help)."""
    if any(d.retry_after is None for d in denied):
        return None
    return max([seconds_left(d) for d in denied] + [1])


def apply(response, decisions: Sequence[Decision], denied: Sequence[Decision] = ()) -> None:
    """Set the headers of the enforced policies; shadow policies never show to clients."""
    policy_items, items = [], []
    plain = True  # every item printable ASCII
    # each decision's fields unpacked at once: reading them by name costs a Python step each
    for policy, _subject, _allowed, exceeded, _count, limit, remaining, reset_in, retry, _cost, window in decisions:
        if policy.enforce:
            # the policy's own limit and window (most responses): the policy is the key, no tuple made
            key = policy if window == 0 and limit == policy.limit else (policy, limit, window)
            kept = _kept(key) or _made(key, policy, limit, window)
            policy_items.append(kept[0])
            plain = plain and kept[2]
            left = retry if exceeded and retry is not None else reset_in  # seconds_left()
            items.append(f"{kept[1]}{remaining};t={ceil(left) if left > 0 else 0}")
    if policy_items:
        policy_value, value = ", ".join(policy_items), ", ".join(items)
        store = getattr(response.headers, "_store", None)
        # printable ASCII is what Django's header setter would store as it is: then it is stored without the
        # setter's checks, which cost a header 4.7k instructions (the RateLimit value holds the same names)
        if type(store) is dict and plain:
            # Django's ResponseHeaders keeps (name, value) by the lowercased name
            store["ratelimit-policy"] = ("RateLimit-Policy", policy_value)
            store["ratelimit"] = ("RateLimit", value)
        else:
            response.headers["RateLimit-Policy"] = policy_value
            response.headers["RateLimit"] = value
    wait = retry_after(denied) if denied else None
    if wait is not None:
        response.headers["Retry-After"] = str(wait)
