"""decide.lua's reply read into a Verdict, and what the worker's tally is handed of it: the script
leaves the totals, the live index and the count of active subjects to the worker (tally.py)."""

from __future__ import annotations

from typing import Sequence

from ..strategies import STRATEGIES
from ..values import Check, Decision, Metered, Verdict, charge
from .arguments import SEEN_COUNTED, SEEN_NOTHING, SEEN_REFUSED, Ask
from .hooks import hooks
from .server_clock import server_clock
from .tally import tally

ABSENT = -3  # the retry a strategy's Lua half reports for a counter it needs the saved usage of (contract.lua)


class CounterAbsent(Exception):
    """Redis has no counter for these checks' span (a quota's period): ask again with the usage saved for it."""

    def __init__(self, checks: Sequence[Check], now_ms: int) -> None:
        super().__init__(f"{len(checks)} counter(s) absent")
        self.checks = checks
        self.now_ms = now_ms


def verdict_of(checks: Sequence[Check], reply: list | int, call: Ask, parts: Sequence[list],
               asked: float | None = None) -> Verdict:
    """The verdict decide.lua's `reply` says for `checks`, whose script parts (check_parts) were sent at
    `asked` (monotonic seconds; None: not known)."""
    cost = base = call.cost
    if type(reply) is int:  # one policy's count, the rest told by the worker's clock (decide.lua)
        policy = checks[0].policy
        if not (policy.plugin or policy.meters):  # a plug-in's span, a metered estimate: the loop below
            return _counted(checks[0], reply, call, parts[0])
        reply = (-1, reply, -1, -1 if reply < 0 or reply == cost else -2)
    now_ms = reply[0]
    if now_ms < 0:  # the call read no clock (a fixed window's repeat): its window ends by Redis's, as told here
        now_ms = server_clock.now_ms()
    elif call.now is None:  # Redis's own time
        server_clock.seen(now_ms, asked)
    if ABSENT in reply[3::3]:  # a quota without its counter: refused (a negative count), retry ABSENT
        absent = [check for i, check in enumerate(checks) if reply[1 + 3 * i] < 0 and reply[3 + 3 * i] == ABSENT]
        if absent:
            raise CounterAbsent(absent, now_ms)
    decisions = []
    seen = []  # the script leaves the totals and the live index to the worker (tally.py)
    denied = metering = False
    split = call.split  # each policy charged in its own unit (values.splits)
    at = 1
    for (policy, subject, limit, plan), sent in zip(checks, parts):
        count, reset_ms, third = reply[at], reply[at + 1], reply[at + 2]
        at += 3
        if split:
            cost = charge(policy, base, True)
        exceeded = count < 0  # then -1 - count, and the third figure is the retry time, else the reset before
        if exceeded:
            count, retry_ms, before_ms = -1 - count, third, -2
        else:
            retry_ms, before_ms = 0, third
        if reset_ms < 0 or retry_ms < 0:  # the call read no clock: the window or period ends by ours
            if policy.plugin:
                ends_in = policy.plugin.span(policy, now_ms)[1] - now_ms
            else:
                ends_in = policy.window_ms - now_ms % policy.window_ms
            reset_ms = ends_in if reset_ms < 0 else reset_ms
            retry_ms = ends_in if retry_ms < 0 else retry_ms
        allowed = not (exceeded and policy.enforce)
        denied = denied or not allowed
        if policy.meters:
            metering = True
        capacity = policy.capacity(limit)  # a token bucket's count is compared with its burst
        retry_after = retry_ms / 1000 if exceeded and cost <= policy.largest_cost(limit) else None  # None: never fits
        window = 0
        if policy.plugin:  # the span the counter ends with: its length for `w`, its start for the saved usage
            start, end = policy.plugin.span(policy, now_ms + max(reset_ms, retry_ms, 1) - 1)
            window = (end - start) // 1000
            if not call.dry_run:
                hooks.counted(policy, subject.key, subject.display, start, count, limit)
        # positional: this runs for every policy of every request
        decision = Decision(
            policy, subject, allowed, exceeded, count, limit,
            capacity - count if count < capacity else 0, reset_ms / 1000, retry_after, cost, window,
        )
        decisions.append(decision)
        if not call.dry_run:
            seen.append(_seen(policy, sent, exceeded, count, reset_ms, before_ms, now_ms, cost))
    if seen:
        # a policy over its limit refuses (a shadow one: would have) even when another denied first;
        # every policy below its limit counted the request unless one denied it
        tally.note(seen if not denied else [entry for entry in seen if entry[4]])
    asked = 1 + 3 * len(checks)  # the version follows the figures when it was asked for
    version = reply[asked] if len(reply) > asked else None
    if denied or call.dry_run or not metering:
        return Verdict(not denied, tuple(decisions), version)
    return Verdict(True, tuple(decisions), version, metered(decisions, now_ms))


def metered(decisions: Sequence[Decision], at_ms: int) -> tuple[Metered, ...]:
    """The estimates an admitted request was charged in its metered policies at `at_ms` (Redis's clock),
    with where each was charged (the strategy's `settling`)."""
    return tuple(
        Metered(d.policy, d.subject, d.cost, *STRATEGIES[d.policy.strategy].settling(d.policy, d.limit, at_ms))
        for d in decisions if d.policy.meters and not d.exceeded
    )


def _seen(policy, sent: list, exceeded: bool, count: int, reset_ms: int, before_ms: int, now_ms: int,
          cost: int) -> tuple:
    """What the tally is handed of one decision; `sent` (the check's script part) keeps what this subject's
    next call here sends (its terms' last figure): a hint, exact either way."""
    seen = (policy, sent[2], sent[3], sent[4] == SEEN_REFUSED, exceeded, count, reset_ms, before_ms, now_ms, cost)
    sent[4] = SEEN_REFUSED if exceeded else SEEN_COUNTED if count > cost else SEEN_NOTHING
    return seen


def _counted(check: Check, count: int, call: Ask, sent: list) -> Verdict:
    """verdict_of() for one policy (neither a plug-in's nor metered) answered with its count alone: its
    window ends by the worker's clock, the retry with it when refused (the loop above, in fewer steps)."""
    policy, subject, limit, _plan = check
    cost = call.cost
    now_ms = server_clock.now_ms()
    ends_in = policy.window_ms - now_ms % policy.window_ms
    exceeded = count < 0
    if exceeded:
        count = -1 - count
        before_ms = -2
        retry_after = ends_in / 1000 if cost <= policy.largest_cost(limit) else None
    else:
        before_ms = -1 if count == cost else -2
        retry_after = None
    allowed = not (exceeded and policy.enforce)
    capacity = policy.capacity(limit)
    decision = Decision(policy, subject, allowed, exceeded, count, limit, capacity - count if count < capacity else 0,
                        ends_in / 1000, retry_after, cost, 0)
    if not call.dry_run:
        tally.note([_seen(policy, sent, exceeded, count, ends_in, before_ms, now_ms, cost)])
    return Verdict(allowed, (decision,), None)

