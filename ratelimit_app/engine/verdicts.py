"""decide.lua's reply read into a Verdict, and what the worker's tally is handed of it: the script
leaves the totals, the live index and the count of active subjects to the worker (tally.py)."""

from __future__ import annotations

from typing import Sequence

from ..strategies import STRATEGIES
from ..values import Check, CompiledPolicy, Decision, Metered, Subject, Verdict, charge
from .arguments import (ADMITTED, CAPACITY, LARGEST, MEMBER, REFUSED, SEEN, SEEN_COUNTED, SEEN_NOTHING, SEEN_REFUSED,
                        SHARD, Ask)
from .hooks import hooks
from .server_clock import server_clock
from .tally import tally

ABSENT = -3  # the retry a strategy's Lua half reports for a counter it needs the saved usage of (contract.lua)


# Decision(...) and Verdict(...) run the named tuples' Python __new__ (their defaults) each time: made directly
_made = tuple.__new__


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
    # the script leaves the totals and the live index to the worker (tally.py): the tally's keys of the
    # requests that count and nothing more, and the records of those that write more
    counted: list[tuple] = []
    noted: list[tuple] = []
    denied = metering = False
    split = call.split  # each policy charged in its own unit (values.splits)
    tallying = not call.dry_run
    # each policy's three figures follow Redis's time: its count (-1 - count when over its limit), the ms
    # until its counter empties, and the retry ms when over its limit, else where it emptied before
    # (contract.lua); taken three at a time from one iterator
    figures = iter(reply)
    next(figures)
    for (policy, subject, limit, _plan), sent, count, reset_ms, third in zip(checks, parts, figures, figures, figures):
        if split:
            cost = charge(policy, base, True)
        if policy.meters:
            metering = True
        if reset_ms < 0:  # the call read no clock: the window or period ends by ours
            reset_ms = _ends_in(policy, now_ms)
        window = 0 if policy.plugin is None else _span_of(policy, subject, count, limit, now_ms, reset_ms, third, call)
        capacity = sent[CAPACITY]  # a token bucket's count is compared with its burst
        if count >= 0:  # below its limit: counted unless another policy denies
            # positional: this runs for every policy of every request
            decisions.append(_made(Decision, (
                policy, subject, True, False, count, limit, capacity - count if count < capacity else 0,
                reset_ms / 1000, None, cost, window)))
            if tallying:
                _admitted(policy, sent, count, reset_ms, third, now_ms, cost, counted, noted)
            continue
        count = -1 - count
        retry_ms = third if third >= 0 else _ends_in(policy, now_ms)
        allowed = not policy.enforce  # a shadow policy only says it would deny
        denied = denied or not allowed
        decisions.append(_made(Decision, (
            policy, subject, allowed, True, count, limit, capacity - count if count < capacity else 0,
            reset_ms / 1000, retry_ms / 1000 if cost <= sent[LARGEST] else None, cost, window)))  # None: never fits
        if tallying:
            _refused(policy, sent, count, reset_ms, now_ms, cost, counted, noted)
    if counted or noted:
        if denied:  # nothing counted: only the policies over their limit refused (a shadow one: would have)
            counted, noted = [key for key in counted if key[2] == "d"], [record for record in noted if record[4]]
        tally.note(noted, counted)
    asked = 1 + 3 * len(checks)  # the version follows the figures when it was asked for
    version = reply[asked] if len(reply) > asked else None
    if denied or call.dry_run or not metering:
        return _made(Verdict, (not denied, tuple(decisions), version, ()))
    return Verdict(True, tuple(decisions), version, metered(decisions, now_ms))


def _ends_in(policy: CompiledPolicy, now_ms: int) -> int:
    """The ms until the policy's window (a plug-in's span) ends, by the worker's clock."""
    if policy.plugin is None:
        return policy.window_ms - now_ms % policy.window_ms
    return policy.plugin.span(policy, now_ms)[1] - now_ms


def _span_of(policy: CompiledPolicy, subject: Subject, count: int, limit: int, now_ms: int, reset_ms: int,
             third: int, call: Ask) -> int:
    """A plug-in's span the counter ends with: its length in seconds for `w`; its start for the saved usage."""
    exceeded = count < 0
    retry_ms = (third if third >= 0 else _ends_in(policy, now_ms)) if exceeded else 0
    start, end = policy.plugin.span(policy, now_ms + max(reset_ms, retry_ms, 1) - 1)
    if not call.dry_run:
        hooks.counted(policy, subject.key, subject.display, start, -1 - count if exceeded else count, limit)
    return (end - start) // 1000


def metered(decisions: Sequence[Decision], at_ms: int) -> tuple[Metered, ...]:
    """The estimates an admitted request was charged in its metered policies at `at_ms` (Redis's clock),
    with where each was charged (the strategy's `settling`)."""
    return tuple(
        Metered(d.policy, d.subject, d.cost, *STRATEGIES[d.policy.strategy].settling(d.policy, d.limit, at_ms))
        for d in decisions if d.policy.meters and not d.exceeded
    )


def _admitted(policy: CompiledPolicy, sent: list, count: int, reset_ms: int, before_ms: int, now_ms: int,
              cost: int, counted: list, noted: list) -> None:
    """What the tally is handed of a request a policy admitted: its key in `counted` when it only counts the
    request in its totals bucket (the flush sums those), else its record in `noted` (tally._fold tells
    what it writes). `sent` (the check's parts) keeps what this subject's next call here sends (its terms'
    last figure: a hint, exact either way) and the key of its requests counted in the current totals bucket."""
    refused_before = sent[SEEN] == SEEN_REFUSED
    rest = count - cost  # the count before this request
    sent[SEEN] = SEEN_COUNTED if rest > 0 else SEEN_NOTHING
    bucket = policy.totals_bucket_ms
    # it only counts (tally._fold) unless admitted again after a refusal, or its count passes a power of 2
    # from 2 on (count's top bit is not rest's), or its counter starts (-1) or empties in another totals
    # bucket than before (a known before_ms, >= 0)
    if refused_before or not (count < 2 or rest >= count ^ rest >= 0) or before_ms == -1 or before_ms >= 0 \
            and before_ms != reset_ms and -(-(now_ms + before_ms) // bucket) != -(-(now_ms + reset_ms) // bucket):
        noted.append((policy, sent[MEMBER], sent[SHARD], refused_before, False, count, reset_ms, before_ms, now_ms,
                      cost))
        return
    key = sent[ADMITTED]
    if key[3] != now_ms // bucket:  # made once a totals bucket: the flush counts it by identity
        key = sent[ADMITTED] = (policy, sent[SHARD], "a", now_ms // bucket)
    counted.append(key)


def _refused(policy: CompiledPolicy, sent: list, count: int, reset_ms: int, now_ms: int, cost: int, counted: list,
             noted: list) -> None:
    """_admitted() for a request a policy refused: a subject refused again only counts a refusal."""
    if sent[SEEN] != SEEN_REFUSED:  # its live index entry says it is refused (tally._fold)
        sent[SEEN] = SEEN_REFUSED
        noted.append((policy, sent[MEMBER], sent[SHARD], False, True, count, reset_ms, -2, now_ms, cost))
        return
    key = sent[REFUSED]
    if key[3] != now_ms // policy.totals_bucket_ms:
        key = sent[REFUSED] = (policy, sent[SHARD], "d", now_ms // policy.totals_bucket_ms)
    counted.append(key)


def _counted(check: Check, count: int, call: Ask, sent: list) -> Verdict:
    """verdict_of() for one policy (neither a plug-in's nor metered) answered with its count alone: its
    window ends by the worker's clock, the retry with it when refused (the loop above, in fewer steps)."""
    policy, subject, limit, _plan = check
    cost = call.cost
    now_ms = server_clock.now_ms()
    ends_in = policy.window_ms - now_ms % policy.window_ms
    capacity = sent[CAPACITY]
    if count >= 0:
        decision = _made(Decision, (policy, subject, True, False, count, limit,
                                    capacity - count if count < capacity else 0, ends_in / 1000, None, cost, 0))
        if not call.dry_run:
            counted: list[tuple] = []
            noted: list[tuple] = []
            # -1: the counter starts with this request; -2: where it emptied before is not told
            _admitted(policy, sent, count, ends_in, -1 if count == cost else -2, now_ms, cost, counted, noted)
            tally.note(noted, counted)
        return _made(Verdict, (True, (decision,), None, ()))
    count = -1 - count
    allowed = not policy.enforce
    decision = _made(Decision, (policy, subject, allowed, True, count, limit,
                                capacity - count if count < capacity else 0, ends_in / 1000,
                                ends_in / 1000 if cost <= sent[LARGEST] else None, cost, 0))
    if not call.dry_run:
        counted, noted = [], []
        _refused(policy, sent, count, ends_in, now_ms, cost, counted, noted)
        tally.note(noted, counted)
    return _made(Verdict, (allowed, (decision,), None, ()))
