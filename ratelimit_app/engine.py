"""The one call to Redis: decide every applicable policy of a request in a single Lua script.

Scripts are real .lua files (one per strategy plus the entry points), assembled at import and run
through redis-py's Script, which does EVALSHA and reloads the script by itself after NOSCRIPT.
"""

from __future__ import annotations

import threading
import time
from importlib import resources
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence, TypeVar

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver
from django_redis import get_redis_connection
from redis.commands.core import Script

from . import keys
from .conf import get_setting

if TYPE_CHECKING:
    from .policies import CompiledPolicy
    from .subjects import Subject

T = TypeVar("T")
STRATEGY_FILES = ("fixed_window.lua", "sliding_window.lua", "sliding_log.lua")


class RedisUnavailable(Exception):
    """Redis could not answer (down, timed out, or the circuit is open); the doors apply RATELIMIT_FAIL_OPEN."""


class Check(NamedTuple):
    """One policy to decide for one subject, with the limit in effect for that subject."""

    policy: CompiledPolicy
    subject: Subject
    limit: int


class Decision(NamedTuple):
    policy: CompiledPolicy
    subject: Subject
    allowed: bool  # this policy lets the request through (a shadow policy always does)
    exceeded: bool  # the request was over the limit (for a shadow policy: it would have been denied)
    count: int  # requests counted in the window, this one included when it was counted
    limit: int
    remaining: int
    reset_in: float  # seconds until every counted request has left the window
    retry_after: float | None  # seconds until a request would be admitted again, when exceeded


class Verdict(NamedTuple):
    allowed: bool
    decisions: tuple[Decision, ...]
    version: int | None  # the policy version read in the same call (None when Redis was not asked)

    @property
    def denied_by(self) -> tuple[Decision, ...]:
        return tuple(decision for decision in self.decisions if not decision.allowed)


class SubjectUsage(NamedTuple):
    key: str
    display: str
    count: int
    reset_in: float
    limit: int  # the limit in effect for this subject
    overridden: bool  # an override gave this subject a limit other than the policy's


class LiveUsage(NamedTuple):
    allowed: int
    denied: int
    subjects: list[SubjectUsage]  # active in the current window, in no particular order


NO_POLICIES = Verdict(True, (), None)


# --- scripts -----------------------------------------------------------------------------------


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text(encoding="utf-8")


def _assemble(entry: str) -> str:
    parts = ["local strategies = {}"] + [_lua(name) for name in STRATEGY_FILES] + [_lua(entry)]
    return "\n".join(parts)


class _Scripts:
    """The Script objects, created once with the first client (a Script only needs one for its SHA)."""

    def __init__(self) -> None:
        self._sources = {"decide": _assemble("decide.lua"), "live": _assemble("live.lua")}
        self._scripts: dict[str, Script] = {}

    def get(self, name: str, client: redis.Redis) -> Script:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = client.register_script(self._sources[name])
        return script


_scripts = _Scripts()


# --- the circuit breaker -----------------------------------------------------------------------


class CircuitBreaker:
    """After a Redis error, fail fast for a while instead of adding a timeout to every request."""

    def __init__(self) -> None:
        self.open_until = 0.0
        self.failures = 0  # Redis errors seen, for monitoring
        self._lock = threading.Lock()

    def call(self, operation: Callable[[], T]) -> T:
        if self.open_until and time.monotonic() < self.open_until:
            raise RedisUnavailable("Redis circuit is open after a recent error")
        try:
            result = operation()
        except redis.RedisError as error:
            with self._lock:
                self.failures += 1
                self.open_until = time.monotonic() + get_setting("RATELIMIT_BREAKER_SECONDS")
            raise RedisUnavailable(f"Redis error: {error}") from error
        self.open_until = 0.0
        return result

    def reset(self) -> None:
        self.open_until = 0.0


breaker = CircuitBreaker()


_client: redis.Redis | None = None


def client() -> redis.Redis:
    """The django-redis client of RATELIMIT_CACHE (thread-safe; looked up once, not per request)."""
    global _client
    if _client is None:
        _client = get_redis_connection(get_setting("RATELIMIT_CACHE"))
    return _client


@receiver(setting_changed, dispatch_uid="ratelimit_cache_changed")
def _forget_client(setting: str, **kwargs: object) -> None:
    global _client
    if setting in ("CACHES", "RATELIMIT_CACHE"):
        _client = None


def _now_arg(now: float | None) -> str:
    return "" if now is None else str(int(now * 1000))


# --- deciding ----------------------------------------------------------------------------------


def decide(checks: Sequence[Check], *, now: float | None = None, dry_run: bool = False) -> Verdict:
    """Decide every check in one Redis round trip; nothing is counted if an enforcing policy denies.

    `now` (seconds since the epoch) replaces the server's clock, for tests; `dry_run` decides
    without counting anything. Raises RedisUnavailable when Redis cannot answer.
    """
    if not checks:
        return NO_POLICIES
    key_prefix = keys.prefix()
    script_keys: list[str] = []
    args: list[str | int] = [_now_arg(now), "1" if dry_run else "0", get_setting("RATELIMIT_LIVE_INDEX_SIZE"), len(checks)]
    for policy, subject, limit in checks:
        script_keys += (
            keys.counter_key(policy, subject.key, key_prefix),
            keys.live_key(policy, key_prefix),
            keys.totals_key(policy, key_prefix),
        )
        args += (policy.strategy, limit, policy.window_ms, policy.bucket_ms, "1" if policy.enforce else "0", live_member(subject, limit, policy))
    script_keys.append(keys.version_key(key_prefix))
    redis_client = client()
    script = _scripts.get("decide", redis_client)
    reply = breaker.call(lambda: script(script_keys, args, redis_client))
    return _verdict(checks, reply)


def _verdict(checks: Sequence[Check], reply: list[int]) -> Verdict:
    version, _now, denied = reply[0], reply[1], reply[2]
    decisions = []
    for i, (policy, subject, limit) in enumerate(checks):
        exceeded, count, reset_ms, retry_ms = reply[3 + 4 * i : 7 + 4 * i]
        # positional: this runs for every policy of every request
        decisions.append(
            Decision(
                policy, subject, not (exceeded and policy.enforce), bool(exceeded), count, limit,
                limit - count if count < limit else 0, reset_ms / 1000, retry_ms / 1000 if exceeded else None,
            )
        )
    return Verdict(not denied, tuple(decisions), version)


# --- the operator's side -----------------------------------------------------------------------


def live_usage(policy: CompiledPolicy, *, now: float | None = None) -> LiveUsage:
    """Totals of the current window and every subject active in it, read in one call."""
    head, tail = keys.counter_key_parts(policy)
    args = [_now_arg(now), policy.strategy, policy.limit, policy.window_ms, policy.bucket_ms, head, tail]
    redis_client = client()
    script = _scripts.get("live", redis_client)
    reply = breaker.call(lambda: script([keys.live_key(policy), keys.totals_key(policy)], args, redis_client))
    subjects: dict[str, SubjectUsage] = {}
    for i in range(3, len(reply), 3):  # oldest first: a subject seen again under a new limit keeps the newest
        member, count, reset_ms = reply[i : i + 3]
        subject_key, limit, overridden, display = parse_live_member(member.decode())
        subjects[subject_key] = SubjectUsage(subject_key, display, count, reset_ms / 1000, limit or policy.limit, overridden)
    return LiveUsage(reply[1], reply[2], list(subjects.values()))


def live_member(subject: Subject, limit: int, policy: CompiledPolicy) -> str:
    """The live index entry of a subject: '<hash> <limit>[*] <display>', '*' marking an override."""
    return f"{subject.key} {limit}{'*' if limit != policy.limit else ''} {subject.display}"


def parse_live_member(member: str) -> tuple[str, int, bool, str]:
    subject_key, limit, display = (member.split(" ", 2) + ["", ""])[:3]
    return subject_key, int(limit.rstrip("*") or 0), limit.endswith("*"), display


def reset_subjects(policy: CompiledPolicy, subject_keys: Sequence[str]) -> int:
    """Forget the counts of these subjects under this policy; returns how many counters existed."""
    if not subject_keys:
        return 0
    redis_client = client()
    live_key = keys.live_key(policy)

    def reset() -> int:
        wanted = set(subject_keys)
        members = [m for m in redis_client.zrange(live_key, 0, -1) if m.decode().partition(" ")[0] in wanted]
        with redis_client.pipeline() as pipe:
            pipe.delete(*(keys.counter_key(policy, key) for key in subject_keys))
            if members:
                pipe.zrem(live_key, *members)
            return pipe.execute()[0]

    return breaker.call(reset)


def read_version() -> int:
    return int(breaker.call(lambda: client().get(keys.version_key())) or 0)


def bump_version() -> int:
    """Tell every worker that policies changed; they reload within RATELIMIT_POLICY_RECHECK_SECONDS."""
    return breaker.call(lambda: client().incr(keys.version_key()))


class PolicyActivity(NamedTuple):
    active: int  # subjects seen in the current window
    allowed: int  # requests counted in the current window
    denied: int  # requests denied (shadow: that would have been) in the current window


def policy_activity(policies: Sequence) -> dict[int, PolicyActivity]:
    """Activity of many policies (rows or compiled) in their current window, in one round trip."""
    if not policies:
        return {}
    redis_client = client()
    now_ms = int(time.time() * 1000)

    def read() -> list:
        with redis_client.pipeline(transaction=False) as pipe:
            for policy in policies:
                window_ms = policy.window * 1000
                pipe.zcount(keys.live_key(policy), f"({now_ms - window_ms}", "+inf")
                pipe.hmget(f"{keys.totals_key(policy)}:{now_ms // window_ms}", "a", "d")
            return pipe.execute()

    replies = breaker.call(read)
    return {
        policy.id: PolicyActivity(replies[2 * i], int(replies[2 * i + 1][0] or 0), int(replies[2 * i + 1][1] or 0))
        for i, policy in enumerate(policies)
    }
