"""The values a decision is made of and gives back: no I/O, no Django models, nothing imported from above."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence


# a policy's unit: what its limit counts. Requests (a request's cost, known before the view), the bytes of
# the response body (counted by the app), or a unit the view reports once it knows (settle(): 'tokens')
REQUESTS = "requests"
CONTENT_BYTES = "content-bytes"


class Unavailable(Exception):
    """The limiter could not decide (Redis, the database it reads policies from, a broken setting):
    raised by hit(), check() and usage() where RATELIMIT_FAIL_OPEN says to refuse; the middleware
    answers it 503 with Retry-After."""


class Subject(NamedTuple):
    key: str  # 16 hex digits of blake2b(canonical subject): what Redis keys carry
    display: str  # readable, at most 100 characters, secrets masked: what the admin shows


class KeyPart(NamedTuple):
    """One part of a key spec: its canonical label and how to read its value from a request."""

    label: str
    read: Callable[[object], str | None]  # request -> canonical value, or None when it cannot be computed
    show: Callable[[str], str]  # canonical value -> display
    reads_user: bool = False  # may read request.user (async views load the user before computing it)
    # its value names the caller themselves, not something any request may write: usage() shows such subjects
    identifies_caller: bool = False
    # (request, canonical value) -> display, where the request tells more than the value: a user's name
    named: Callable[[object, str], str] | None = None


KeySpec = tuple[KeyPart, ...]


# eq=False: a snapshot is itself, compared and hashed by identity in C; the worker's tallies and caches,
# keyed by policy for every request, spare a Python-level __hash__ (one load's snapshots are shared)
@dataclass(frozen=True, slots=True, eq=False)
class CompiledPolicy:
    """A validated, immutable snapshot of one Policy row, with what the hot path needs precomputed."""

    id: int
    name: str
    action: str
    limit: int
    window: int
    strategy: str
    key: str
    key_spec: KeySpec
    methods: frozenset[str]
    mode: str
    bucket_size: int | None
    generation: int
    burst: int | None  # requests allowed at once (a token bucket), at most the limit in effect; None: that limit
    window_ms: int
    bucket_ms: int  # the scripts' bucket slot, the strategy's own figure (a bucket in ms, a burst)
    shape: str  # part of the counter key: a change of strategy, window or bucket starts fresh counters
    enforce: bool  # mode == enforce, kept as a plain bool for the hot path
    totals_bucket_ms: int  # the bucket of the policy's totals (see totals_bucket_ms)
    counts_users: bool  # whether computing the subject may read request.user (AuthenticationMiddleware first)
    holds: bool  # a request keeps its place until its response is done (requests in flight)
    period: str = ""  # a calendar quota's period (day, week, month), '' for a window of seconds
    time_zone: str = ""  # where a calendar quota's days begin (a zoneinfo name)
    most: int | None = None  # the largest cost one request may take (the strategy's bound); None: any
    # its strategy when the engine asks it at each decision (terms that move, its span's end, usage kept
    # beyond Redis: strategies/base.py `asked`); None for the others, whose terms are made once
    plugin: Any = None
    unit: str = REQUESTS  # what the limit counts (REQUESTS, CONTENT_BYTES, or a unit the view settles)
    meters: bool = False  # unit != REQUESTS: a request's estimate is settled after it (a plain bool for the hot path)
    overage_cap: int | None = None  # the most units a settle charges beyond a request's estimate (None: all it used)

    def applies_to_method(self, method: str) -> bool:
        return not self.methods or method in self.methods

    def capacity(self, limit: int) -> int:
        """What a subject's count is compared with under `limit`: the limit, or a token bucket's burst."""
        return limit if self.burst is None or self.burst > limit else self.burst

    def largest_cost(self, limit: int) -> int:
        """The most units one request may take under `limit`: a larger cost never fits."""
        capacity = self.capacity(limit)
        return capacity if self.most is None or self.most > capacity else self.most


class Check(NamedTuple):
    """One policy to decide for one subject, with the limit in effect for that subject."""

    policy: CompiledPolicy
    subject: Subject
    limit: int
    plan: str = ""  # the plan that set the limit ('' when the policy or an override did)


def splits(checks: Sequence[Check], cost: int) -> bool:
    """Whether a request of `cost` units is charged in each policy's own unit: one that meets a metered
    policy takes its estimate there and one request from each policy counting requests."""
    return cost != 1 and any(check.policy.meters for check in checks)


def charge(policy: CompiledPolicy, cost: int, split: bool) -> int:
    """The units a policy is charged of a request of `cost` (`split`: splits() said so)."""
    return 1 if split and not policy.meters else cost


class Decision(NamedTuple):
    """What one policy decided for one request: whether it let the request through, the units counted
    against `limit` in the window, those `remaining`, and the seconds until the window empties
    (`reset_in`) or, when over the limit, until the request's `cost` fits again (`retry_after`)."""

    policy: CompiledPolicy
    subject: Subject
    allowed: bool  # this policy lets the request through (a shadow policy always does)
    exceeded: bool  # the request was over the limit (for a shadow policy: it would have been denied)
    count: int  # units counted in the window, this request's included when it was counted
    limit: int
    remaining: int  # units left
    reset_in: float  # seconds until every counted request has left the window
    retry_after: float | None  # seconds until the cost would fit again, when exceeded; None: it never will
    cost: int = 1  # the units the request took (or would have taken) from the policy
    # a calendar quota's current period in seconds (23 to 25 h a day, 28 to 31 days a month); 0: the policy's window
    window: int = 0

    @property
    def never_fits(self) -> bool:
        """A cost above what the policy allows at once: no wait admits it."""
        return self.cost > self.policy.largest_cost(self.limit)


class Held(NamedTuple):
    """Places a request holds in an in-flight policy, given back when its response is done."""

    policy: CompiledPolicy
    subject: Subject
    lease: str
    cost: int


class Metered(NamedTuple):
    """A request's estimate charged in a metered policy (its unit is not requests), and how a settle
    moves that counter (the strategy's `settling`): its layout, the window or bucket charged, a figure."""

    policy: CompiledPolicy
    subject: Subject
    estimate: int
    layout: str
    anchor: int
    figure: int


class Adjustment(NamedTuple):
    """Units to move a metered counter by, after the request: more (it used more than its estimate) or
    back (less), where its estimate was charged."""

    charged: Metered
    units: int


class Verdict(NamedTuple):
    """The answer for one request: `allowed` when every enforced policy let it through, with each
    policy's Decision. A refused request is counted by no policy."""

    allowed: bool
    decisions: tuple[Decision, ...]
    version: bytes | None  # the policy version token read in the same call (None when not read)
    # the estimates charged in metered policies, when the request was admitted (each may be settled)
    metered: tuple[Metered, ...] = ()

    @property
    def denied_by(self) -> tuple[Decision, ...]:
        return tuple(decision for decision in self.decisions if not decision.allowed)


NO_POLICIES = Verdict(True, (), None)
