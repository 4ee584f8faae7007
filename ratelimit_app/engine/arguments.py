"""What one decide call sends: decide.lua's KEYS and ARGV for a request's checks, and the parts of
each check kept in the process's cache so that a subject's next request builds nothing again."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ..lru import BoundedCache, byte_bounded_cache, size_of
from ..values import Check, CompiledPolicy, Subject, charge
from . import keys
from .scripts import STRATEGY_CODES, now_arg
from .server_clock import server_clock


class Ask(NamedTuple):
    """What one decide call says beside its checks."""

    now: float | None
    dry_run: bool
    cost: int
    lease: str
    # (policy id, subject key) -> (span start ms, used): the usage saved of spans that Redis did not hold
    # (asked again after the script said so: hooks.saved_usage)
    seeds: dict | None = None
    split: bool = False  # each policy charged in its own unit (values.splits): policies counting requests take 1


def ordinary(call: Ask) -> bool:
    """Whether the call is an ordinary request's (the server's clock, a cost of 1, no lease, counted),
    which decide.lua takes with the policies' terms alone; any other goes to decide_with.lua."""
    return call.now is None and not call.dry_run and call.cost == 1 and not call.lease


def entry(call: Ask) -> str:
    """The entry point (scripts.py) that takes this call."""
    return "decide" if ordinary(call) else "decide_with"


def script_call(checks: Sequence[Check], call: Ask, version: bool) -> tuple[list[str], list[str], list[list]]:
    """The KEYS and ARGV of the entry point for these checks, entry(call) (`version`: bring the policy
    version back too; never on a cluster, where the version lives in another slot), and each check's
    parts (check_parts), which the verdict reads again."""
    key_prefix = keys.prefix()
    script_keys: list[str] = []
    args = [] if ordinary(call) else [
        ("d" if call.dry_run else "") + now_arg(call.now), _sent_costs(checks, call), call.lease
    ]
    shard_count = keys.shards()  # part of the keys: a changed setting makes new parts
    found = []
    for policy, subject, limit, plan in checks:
        parts = _kept_parts((policy, subject, limit, plan, key_prefix, shard_count))
        if parts is None:
            parts = check_parts(policy, subject, limit, plan, key_prefix, shard_count)
        found.append(parts)
        script_keys.append(parts[0])
        if policy.plugin:  # its terms move on (a calendar quota's periods): its strategy says them at each call
            args.append(_moving_terms(policy, subject, parts[1][parts[4]], call))
        else:
            args.append(parts[1][parts[4]])
    if version:
        script_keys.append(keys.version_key(key_prefix))
    return script_keys, args, found


def _moving_terms(policy: CompiledPolicy, subject: Subject, head: str, call: Ask) -> str:
    """An asked strategy's terms: the check's `head` (what a window's terms are) and its own at this call."""
    now_ms = server_clock.now_ms() if call.now is None else int(call.now * 1000)
    seed = call.seeds.get((policy.id, subject.key)) if call.seeds else None
    return f"{head} {policy.plugin.terms(policy, now_ms, seed)}"


def _sent_costs(checks: Sequence[Check], call: Ask) -> str:
    """ARGV[2]: the cost, or each check's own charge (space-separated) when they differ (call.split)."""
    if not call.split:
        return str(_sent_cost(checks, call.cost))
    most = _sent_cost(checks, call.cost)
    return " ".join(str(min(charge(check.policy, call.cost, True), most)) for check in checks)


def _sent_cost(checks: Sequence[Check], cost: int) -> int:
    """The cost as the script is asked to take it: a cost above every policy's capacity is refused by
    each of them whatever its size, so it is sent as one more than the largest capacity, which keeps
    the script's work and arithmetic bounded by the policies' own figures (the verdict keeps the real cost)."""
    if cost == 1:
        return 1
    return min(cost, max(check.policy.capacity(check.limit) for check in checks) + 1)


NO_KEY = (None, -1, "", -1)  # a tally key of no totals bucket: the first count makes the check's own


def _parts_size(key: tuple, parts: list) -> int:
    # the key, its subject (shared by a request's policies: counted for each, a bound), the parts, their
    # counter key and live member, the tally's keys they keep; the terms are shared by a policy's subjects
    subject = key[1]
    return size_of(key, subject, subject.key, subject.display, parts, parts[0], parts[2]) + 2 * _TALLY_KEY_BYTES


_TALLY_KEY_BYTES = size_of((None, 0, "a", 0))


# (policy, subject, limit, plan, key prefix, shards) -> check_parts, within their share of RATELIMIT_CACHE_BYTES
# whatever the number of policies: a flood of new subjects only costs building the oldest ones again
script_parts = BoundedCache("ratelimit_app.engine.arguments.script_parts", _parts_size)
_kept_parts = script_parts.get

# What a subject's last decision in this worker saw, sent as its terms' last figure: refused (the
# counter is read before anything is written), or admitted with units already counted (a token
# bucket then expects its burst in use and moves it with one INCRBY). A hint: either way is exact.
SEEN_NOTHING, SEEN_REFUSED, SEEN_COUNTED = 0, 1, 2
# The places in a check's parts (check_parts), which the verdict reads: what the check sent and keeps for
# the subject's next call here, and what its policy makes of its limit, worked out once rather than each call
COUNTER, TERMS, MEMBER, SHARD, SEEN, CAPACITY, LARGEST, ADMITTED, REFUSED = range(9)


def check_parts(
    policy: CompiledPolicy, subject: Subject, limit: int, plan: str, key_prefix: str, shard_count: int
) -> list:
    """What one check adds to decide.lua's call (its counter, its terms) and what the worker's tally
    writes for it (its live index entry, its shard), kept in script_parts for next time; with
    what its last decision here saw (SEEN_NOTHING, SEEN_REFUSED, SEEN_COUNTED), which picks the terms sent,
    the policy's capacity and largest cost under `limit`, and the tally's keys of the requests it admitted
    and refused in a totals bucket (verdicts.py: none until then)."""
    parts = [
        keys.counter_key(policy, subject.key, key_prefix),
        _terms(policy, limit),
        live_member(subject, limit, policy, plan),
        keys.shard_of(subject.key),
        SEEN_NOTHING,
        policy.capacity(limit),
        policy.largest_cost(limit),
        NO_KEY,
        NO_KEY,
    ]
    return script_parts.put((policy, subject, limit, plan, key_prefix, shard_count), parts)


@byte_bounded_cache(entry_bytes=768)  # three texts of about 40 characters, in a tuple
def _terms(policy: CompiledPolicy, limit: int) -> tuple[str, str, str]:
    """A policy's terms under `limit`, by what the subject's last decision saw: the same for its every subject."""
    rest = figures(policy)
    return tuple(f"{_first(policy, limit, seen)} {rest}" for seen in (SEEN_NOTHING, SEEN_REFUSED, SEEN_COUNTED))


# The largest limit the terms' first field holds (13 hex digits less 8 bits of flags, exact in Lua). A
# larger one is sent as this: no count reaches either (a subject would need 500,000 requests a second
# for a year), and the verdict reads the real one.
LARGEST_LIMIT = 2**44 - 1


def _first(policy: CompiledPolicy, limit: int, seen: int) -> str:
    """The first field of a policy's terms, all a fixed window's repeat request reads: limit, strategy,
    enforce and seen in one hex number of 13 digits (decide.lua's header)."""
    flags = STRATEGY_CODES[policy.strategy] | (4 if policy.enforce else 0) | seen
    return f"{min(limit, LARGEST_LIMIT) << 8 | flags:013x}"


def figures(policy: CompiledPolicy) -> str:
    """The rest of a policy's terms, the same for every subject and limit: "<window> <bucket> <totals
    bucket>" in hex, window and bucket 9 digits each (a year's ms fit), at fixed places that the Lua half
    reads without a pattern; an asked strategy's own follow, made at each call (_moving_terms)."""
    if max(policy.window_ms, policy.bucket_ms) >= 16**9:
        raise ValueError(f"a window of {policy.window_ms} ms is beyond what the engine counts")
    return f"{policy.window_ms:09x} {policy.bucket_ms:09x} {policy.totals_bucket_ms:x}"


def live_member(subject: Subject, limit: int, policy: CompiledPolicy, plan: str = "") -> str:
    """The live index entry of a subject: '<hash> <limit>[*|@plan] <display>', '*' marking an
    override's limit, '@plan' the limit of the subject's plan (a slug: no space)."""
    mark = f"@{plan}" if plan else ("*" if limit != policy.limit else "")
    return f"{subject.key} {limit}{mark} {subject.display}"
