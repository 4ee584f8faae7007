"""What every part of the bench shares: the results it fills, and how it makes policies, requests,
subjects and engine calls (the one place to adapt when the engine's API moves)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import NamedTuple

import redis
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory
from django_redis import get_redis_connection

from ratelimit_app import engine, strategies
from ratelimit_app.engine import Check
from ratelimit_app.models import Policy, Strategy
from ratelimit_app.policies import CompiledPolicy, compile_policy
from ratelimit_app.subjects import Subject, parse_key_spec, subject_for
from ratelimit_app.values import Held

HUGE = 10**9  # a limit no measurement reaches: every decision admits and counts
STRATEGIES: tuple[str, ...] = tuple(Strategy.values)  # what the Policy model offers, decidable or not yet
factory = RequestFactory()


class Row(NamedTuple):
    """One line of the decisions table (None: not measured for this row)."""

    name: str
    kind: str  # "floor", "ours" or "peer"
    strategies: tuple[str, ...]  # ours: the strategy of each policy decided
    p50: float
    p99: float
    trips: float | None
    sent: float | None
    commands: float | None
    rate: float | None
    admitted: int | None
    refused: float | None = None  # server-side commands of a refused repeat decision (no deny cache)


class Spread(NamedTuple):
    """One line of the spread workload: many subjects, each decided a few times (first decisions count)."""

    name: str
    kind: str  # "floor", "ours" or "peer"
    p50: float
    rate: float  # decisions per second of the processes together
    commands: float  # server-side commands per decision, over the whole run
    script_us: float  # microseconds of the script commands (FCALL, EVALSHA) per decision, their inner commands included
    command_us: float  # microseconds of every other command per decision (the scripts' inner ones included)
    redis_cpu_us: float  # CPU of the Redis server per decision (INFO cpu): commands, sockets, event loop


class Served(NamedTuple):
    """One configuration of the end-to-end table."""

    name: str
    rate: float
    requests: int
    failed: int  # answers other than 2xx (none expected: no limit is reached)
    commands: float  # Redis commands per request (server side)
    script_us: float  # microseconds of the script commands per request, their inner commands included
    command_us: float  # microseconds of every other command per request (the scripts' inner ones included)
    server: str = "gunicorn"  # "gunicorn" (WSGI) or "uvicorn" (ASGI)
    worker_cpu_us: float | None = None  # CPU (user + system) of the site's processes per request; None: not on Linux
    redis_cpu_us: float | None = None  # CPU of the Redis server per request (INFO cpu): commands, sockets, event loop
    rounds: tuple[float, ...] = ()  # requests/s of each round, in the order they ran


@dataclass
class Results:
    quick: bool
    samples: int
    seconds: float = 2.0  # per throughput measurement
    e2e_seconds: float = 2.0  # per configuration and round of the end-to-end run
    e2e_rounds: int = 6  # short interleaved rounds: a burst of load elsewhere hits every configuration
    # the floors and the rows their budgets compare with them: more rounds, because a round of one of them moves
    # by up to 20% on a shared 2-core machine while the budget is 5% (the others stop at e2e_rounds)
    e2e_floor_rounds: int = 24
    floors: dict = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    spread: list[Spread] = field(default_factory=list)
    spread_rounds: int = 3
    spread_decisions: int = 10_000  # a round's decisions per process (2 processes), over 1,000 subjects
    unsupported: dict[str, str] = field(default_factory=dict)  # strategy -> why the engine cannot decide it
    memory: list = field(default_factory=list)  # (strategy, limit, bytes, entries)
    overhead: dict = field(default_factory=dict)
    asynchronous: dict[str, dict | str] = field(default_factory=dict)  # path -> figures or why n/a
    deny_cache: dict | str = "not measured"
    e2e: list[Served] = field(default_factory=list)
    e2e_generator: str = ""
    live: dict | str = "not measured"
    cluster: str = "not measured"
    metering: dict | str = "not measured"  # metered requests beside unmetered ones, and a settle's cost
    vm_growth: dict = field(default_factory=dict)  # (strategy, FCALL or EVALSHA) -> bytes the Lua VM grew by, or why n/a
    vm_subjects: int = 0  # fresh subjects each growth was measured over
    libraries: str = "not measured"  # libraries of ours left after a prune beside an earlier version's
    notes: list[str] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    load_start: float = 0.0  # load average when the run started

    def decidable(self) -> list[str]:
        return [s for s in STRATEGIES if s not in self.unsupported]


def unique() -> int:
    # forked workers create policies too: ids must not repeat across processes
    return secrets.randbelow(10**9) + 10**6


def policy(strategy: str, limit: int = HUGE, window: int = 3600, key: str = "ip", action: str = "*",
           save: bool = False, burst: int | None = None, unit: str = "requests") -> CompiledPolicy:
    row = Policy(name=f"bench-{unique()}", action=action, limit=limit, window=window, strategy=strategy, key=key,
                 burst=burst, period="month" if "period" in strategies.get(strategy).options else "", unit=unit)
    row.full_clean()
    if save:
        row.save()
    else:
        row.pk = unique()
    return compile_policy(row)


def request(ip: str = "203.0.113.7", path: str = "/demo/search/"):
    made = factory.get(path, REMOTE_ADDR=ip)
    made.user = AnonymousUser()
    return made


def subject(ip: str = "203.0.113.7") -> Subject:
    return subject_for(parse_key_spec("ip"), request(ip))


def decide(policies: list[CompiledPolicy], who: Subject, *, limit: int | None = None, now: float | None = None):
    """One engine call deciding `policies` for `who` (each at its own limit unless `limit` is given);
    places taken in in-flight policies are kept (never given back)."""
    checks = [Check(p, who, p.limit if limit is None else limit) for p in policies]
    return engine.decide(checks, now=now, lease=lease() if any(p.holds for p in policies) else "")


def lease() -> str:
    """A request's lease, unique across the bench's processes."""
    return secrets.token_hex(8)


def decider(policies: list[CompiledPolicy], who: Subject, cost: int = 1):
    """A call deciding `policies` for `who` again and again (each call `cost` units), its checks built
    once (as a door would); with in-flight policies, a call takes places and gives them back, as a
    request and its closed response do."""
    checks = [Check(p, who, p.limit) for p in policies]
    if not any(p.holds for p in policies):
        return lambda: engine.decide(checks, cost=cost)

    def take_and_give_back():
        request_lease = lease()
        verdict = engine.decide(checks, cost=cost, lease=request_lease)
        if verdict.allowed:
            engine.release([Held(d.policy, d.subject, request_lease, cost) for d in verdict.decisions if d.policy.holds])
        return verdict

    return take_and_give_back


def client():
    """The engine's own client (django-redis, with the site's short timeouts): what measured calls use."""
    return get_redis_connection("default")


_server = None


def server():
    """A client of the same server with long timeouts, for the bench's own chores (seeding a million
    subjects, FLUSHDB, SLOWLOG, INFO), which the site's 0.25 s timeouts were never meant for."""
    global _server
    if _server is None:
        _server = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=60, socket_connect_timeout=5)
    return _server
