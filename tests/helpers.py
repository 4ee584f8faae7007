"""Small helpers shared by the tests: policies from field values, subjects, round-trip counting."""

from __future__ import annotations

import contextlib
import hashlib
import sys
import threading
import time
from typing import Iterator

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.measure import Wire
from ratelimit_app.engine import Check
from ratelimit_app.models import Policy
from ratelimit_app.policies import CompiledPolicy, compile_policy
from ratelimit_app.subjects import Subject

_ids = iter(range(1000, 10**9))


def policy(save: bool = False, **fields) -> CompiledPolicy:
    """A compiled policy; unsaved unless `save` (engine tests need no database row)."""
    values = {"name": f"p{next(_ids)}", "action": "*", "limit": 10, "window": 60, "strategy": "fixed_window", "key": "ip"}
    values.update(fields)
    row = Policy(**values)
    if save:
        row.full_clean()
        row.save()
    else:
        row.pk = row.pk or next(_ids)
    return compile_policy(row)


def make_policy(**fields) -> Policy:
    """A validated, saved Policy row (a 10 per minute fixed window per IP on every request, unless told)."""
    values = {"name": "policy", "action": "*", "limit": 10, "window": 60, "strategy": "fixed_window", "key": "ip"}
    values.update(fields)
    row = Policy(**values)
    row.full_clean()
    row.save()
    return row


def subject(name: str = "ip:203.0.113.7") -> Subject:
    return Subject(hashlib.blake2b(name.encode(), digest_size=8).hexdigest(), name)


def check(compiled: CompiledPolicy, who: str = "ip:203.0.113.7", limit: int | None = None) -> Check:
    return Check(compiled, subject(who), compiled.limit if limit is None else limit)


@contextlib.contextmanager
def count_round_trips() -> Iterator[list[int]]:
    """Count the commands (round trips) redis-py sends while the block runs; they still reach Redis.
    The totals' background flush (a command of its own, not a request's) waits until the block ends."""
    from ratelimit_app.engine.tally import tally

    counter = [0]
    wire = Wire()
    with tally._flushing, wire.watching():
        yield counter
        counter[0] = wire.trips


def server_commands_per_call(redis_client, operation, count: int = 10, stats: dict | None = None) -> float:
    """Commands the server ran per call of `operation` (INFO commandstats: a script or function counts
    itself and every command it runs), the totals' background flush held back meanwhile; `stats`, when
    given, gets the calls' INFO commandstats, read before the flush may run."""
    from bench.measure import server_commands
    from ratelimit_app.engine.tally import tally

    tally.flush()  # what earlier calls owe the totals is not the measured calls' work
    with tally._flushing:
        redis_client.config_resetstat()
        before = server_commands(redis_client)
        for _ in range(count):
            operation()
        after = server_commands(redis_client)
        if stats is not None:
            stats.update(redis_client.info("commandstats"))
        return (after - before) / count


def in_processes(target, args: tuple = (), processes: int = 8, timeout: float = 60) -> list:
    """Run `target(*args, start, results)` in forked processes that start together (a barrier); each
    puts one result on `results`. Returns the results, one per process. A child still running when
    the time is up is killed, so a hang fails its test instead of stalling the suite at exit."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(processes, timeout=timeout), context.Queue()
    workers = [context.Process(target=_child, args=(target, (*args, start, results))) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        return [results.get(timeout=timeout) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join()


_inherited_connections: list = []


def _child(target, args: tuple) -> None:
    """A forked child opens its own database connections: queries interleaved on the parent's socket
    hang both. The inherited ones are kept, never closed, as closing would end the parent's session."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.vendor != "sqlite" and connection.connection is not None:
            _inherited_connections.append(connection.connection)
            connection.connection = None
    try:
        target(*args)
    finally:
        connections.close_all()  # its own now: the test database can be dropped once the suite ends


def in_threads(target, threads: int = 8) -> tuple[list, list[Exception]]:
    """Run `target()` in threads that start together (a barrier). Returns what the calls returned and
    the errors they raised."""
    start, results, errors = threading.Barrier(threads), [], []

    def run() -> None:
        start.wait()
        try:
            results.append(target())
        except Exception as error:  # noqa: BLE001 - handed to the test, which says what it expects
            errors.append(error)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results, errors


@contextlib.contextmanager
def repeated_meanwhile(step) -> Iterator[None]:
    """`step()` again and again on a thread of its own while the block runs (a flush racing requests)."""
    done = threading.Event()

    def repeat() -> None:
        while not done.is_set():
            step()

    thread = threading.Thread(target=repeat)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def stalled(port: int, seconds: float):
    """The server on `port` sleeps `seconds` (DEBUG SLEEP, sent from another connection), from the
    moment this returns; returns the thread that sent it."""
    sleeper = redis.Redis(port=port)
    probe = redis.Redis(port=port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))
    probe.ping()  # connected before the server stops accepting
    thread = threading.Thread(target=sleeper.execute_command, args=("DEBUG", "SLEEP", seconds))
    thread.start()
    give_up = time.monotonic() + 10  # only stops a loop that would never end
    while True:  # until the server has read the command and sleeps: a PING goes unanswered
        try:
            probe.ping()
        except redis.TimeoutError:
            return thread
        assert time.monotonic() < give_up, "the server never slept"
        time.sleep(0.005)


def move_worker_clock(monkeypatch, seconds: float) -> None:
    """Move this process's clock (every `time.time` the app reads) `seconds` further from Redis's, which
    keeps the true one: a worker host whose clock drifted. Moves add up."""
    real = time.time

    def skewed() -> float:
        return real() + seconds

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("ratelimit_app") and getattr(module, "time", None) is real:
            monkeypatch.setattr(module, "time", skewed)
    monkeypatch.setattr(time, "time", skewed)


def settled(compiled: CompiledPolicy, who: str, used: int, estimate: int = 1, limit: int | None = None) -> None:
    """A request of `who` admitted on `estimate` units of a metered policy, then settled at `used` (which may
    take the subject beyond its limit: debt), as its closing step would send it."""
    from ratelimit_app import engine
    from ratelimit_app.engine.settling import settle_commands
    from ratelimit_app.values import Adjustment

    verdict = engine.decide([check(compiled, who, limit)], cost=estimate)
    assert verdict.allowed, verdict
    for _key, command, _group in settle_commands([Adjustment(verdict.metered[0], used - estimate)], None):
        engine.client().execute_command(*command)
