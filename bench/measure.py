"""Measuring helpers: latency percentiles (interleaved so that load drifts hit every path alike),
round trips and bytes on the wire, server-side commands, time spent inside redis-py, decisions per
second in several processes, and exactness under concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import gc
import inspect
import multiprocessing
import os
import statistics
import threading
import time
from typing import Awaitable, Callable, Iterator

import redis
import redis.asyncio
from redis.connection import Connection


class Wire:
    """Counts commands (round trips) and bytes redis-py sends; they still reach the server."""

    def __init__(self) -> None:
        self.trips = 0
        self.bytes = 0

    @contextlib.contextmanager
    def watching(self) -> Iterator[Wire]:
        original = Connection.send_packed_command
        wire = self
        watcher = threading.get_ident()  # what this thread sends: not a background flush meanwhile

        def counting(self, command, check_health=True):
            if threading.get_ident() != watcher:
                return original(self, command, check_health)
            wire.trips += 1
            wire.bytes += len(command) if isinstance(command, (bytes, bytearray)) else sum(map(len, command))
            return original(self, command, check_health)

        Connection.send_packed_command = counting
        try:
            yield self
        finally:
            Connection.send_packed_command = original


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """As timeit does: a collection of the requests made beforehand would be charged to one call."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def latencies(operation: Callable[[], object], count: int, warmup: int = 200) -> list[float]:
    for _ in range(warmup):
        operation()
    samples = []
    clock = time.perf_counter
    with no_gc():
        for _ in range(count):
            started = clock()
            operation()
            samples.append(clock() - started)
    return samples


def interleaved_latencies(operations: dict[str, Callable[[], object]], count: int, rounds: int = 10) -> dict[str, list[float]]:
    """Latencies of several operations measured in alternating slices, so that a change in the
    machine's load during the run weighs on every operation alike (their ratios are what we report)."""
    samples: dict[str, list[float]] = {name: [] for name in operations}
    for operation in operations.values():
        for _ in range(200):
            operation()
    per_round = max(1, count // rounds)
    clock = time.perf_counter
    for round_number in range(rounds):
        order = list(operations.items())
        if round_number % 2:
            order.reverse()
        with no_gc():
            for name, operation in order:
                taken = samples[name]
                for _ in range(per_round):
                    started = clock()
                    operation()
                    taken.append(clock() - started)
    return samples


def _command_calls() -> list[tuple[object, str]]:
    """Where a command call starts: redis-py's execute_command (sync and asyncio clients), the engine's
    own call on a thread's kept connection (ratelimit_app.engine.decision_connection.execute, also as the
    scripts module imported it), which sends through the connection without execute_command, and the
    asyncio client of decisions (aclients.SentOnce), whose execute_command writes on a connection itself."""
    from ratelimit_app.engine import aclients, decision_connection

    # the module, not the `scripts` the engine's front door names (its instance of _Scripts)
    scripts = importlib.import_module("ratelimit_app.engine.scripts")
    return [(redis.Redis, "execute_command"), (redis.asyncio.Redis, "execute_command"), (decision_connection, "execute"),
            (scripts, "execute"), (aclients.SentOnce, "execute_command")]


@contextlib.contextmanager
def _observing_commands(observe: Callable[[object, tuple, float], None]) -> Iterator[None]:
    """Meanwhile, observe(client, args, seconds) after each outermost command call (see
    _command_calls): a call made inside another (the engine's call on a shared client goes through
    execute_command) is part of it, never observed twice."""
    depth = [0]

    def begin() -> float:
        depth[0] += 1
        return time.perf_counter()

    def end(client, args: tuple, started: float) -> None:
        depth[0] -= 1
        if depth[0] == 0:
            observe(client, args, time.perf_counter() - started)

    def wrap(original):
        if inspect.iscoroutinefunction(original):
            async def observed_async(client, *args, **options):
                started = begin()
                try:
                    return await original(client, *args, **options)
                finally:
                    end(client, args, started)
            return observed_async

        def observed(client, *args, **options):
            started = begin()
            try:
                return original(client, *args, **options)
            finally:
                end(client, args, started)
        return observed

    originals = [(owner, name, getattr(owner, name)) for owner, name in _command_calls()]
    for owner, name, original in originals:
        setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


@contextlib.contextmanager
def timing_redis() -> Iterator[list[float]]:
    """Seconds spent inside command calls (see _command_calls): packing, the network, Redis and
    parsing. Whatever a path spends outside them is the Python it adds around Redis."""
    inside = [0.0]

    def add(_client, _args, seconds: float) -> None:
        inside[0] += seconds

    with _observing_commands(add):
        yield inside


def outside_redis(operation: Callable[[], object], count: int, warmup: int = 200) -> tuple[float, float]:
    """Microseconds per call spent outside redis-py's command calls, median and mean: the Python a
    path adds around its one round trip, free of the network's noise (the median is the budget's
    figure: a few calls preempted by other processes on a busy machine move the mean)."""
    for _ in range(warmup):
        operation()
    outside = []
    clock = time.perf_counter
    with timing_redis() as inside, no_gc():
        for _ in range(count):
            before, started = inside[0], clock()
            operation()
            outside.append(clock() - started - (inside[0] - before))
    return p50(outside), statistics.mean(outside) * 1e6


def async_outside_redis(operations: dict[str, Callable[[], Awaitable[object]]], count: int,
                        warmup: int = 200) -> dict[str, tuple[float, float, float]]:
    """As outside_redis for coroutines, each awaited `count` times, all in one event loop (an asyncio
    client belongs to the loop it was made in): {name: (median and mean us outside Redis, p50 us)}."""

    async def measure(operation) -> tuple[float, float, float]:
        for _ in range(warmup):
            await operation()
        outside, samples = [], []
        clock = time.perf_counter
        with timing_redis() as inside, no_gc():
            for _ in range(count):
                before, started = inside[0], clock()
                await operation()
                taken = clock() - started
                samples.append(taken)
                outside.append(taken - (inside[0] - before))
        return p50(outside), statistics.mean(outside) * 1e6, p50(samples)

    async def run() -> dict[str, tuple[float, float, float]]:
        return {name: await measure(operation) for name, operation in operations.items()}

    return asyncio.run(run())


@contextlib.contextmanager
def recording_commands() -> Iterator[list[tuple]]:
    """The commands sent through the command calls meanwhile (see _command_calls), as (client, args) pairs."""
    sent: list[tuple] = []
    with _observing_commands(lambda client, args, _seconds: sent.append((client, args))):
        yield sent


def cpu_per_call(operation: Callable[[], object], count: int, warmup: int = 200) -> float:
    """Microseconds of this process's user CPU per call: waiting on the socket and the kernel's work
    do not count, so the difference of two paths around the same round trip is their Python cost."""
    for _ in range(warmup):
        operation()
    with no_gc():
        started = os.times().user
        for _ in range(count):
            operation()
        return (os.times().user - started) / count * 1e6


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def p99(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.99) - 1] * 1e6


def command_stats(client) -> dict[str, tuple[int, int]]:
    """INFO commandstats as {command: (calls, microseconds)}, without the bench's own INFO / CONFIG."""
    stats = client.info("commandstats")
    return {
        name: (value["calls"], value["usec"])
        for name, value in stats.items()
        if name not in ("cmdstat_info", "cmdstat_config|resetstat", "cmdstat_config")
    }


def server_commands(client) -> int:
    return sum(calls for calls, _ in command_stats(client).values())


SCRIPT_COMMANDS = ("cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_evalsha_ro", "cmdstat_eval", "cmdstat_eval_ro")


def server_work(client) -> tuple[int, int, int, float]:
    """What the server has done so far: commands run (a script counts once, and once more for each
    command it runs); microseconds of the script commands themselves (each one's time includes the
    commands it runs); microseconds of every other command, those run by scripts included (so the two
    are never added up); CPU seconds of the server process (INFO cpu: commands, sockets, event loop)."""
    stats = command_stats(client)
    cpu = client.info("cpu")
    script_usec = sum(stats[name][1] for name in SCRIPT_COMMANDS if name in stats)
    other_usec = sum(usec for name, (_, usec) in stats.items() if name not in SCRIPT_COMMANDS)
    return (sum(calls for calls, _ in stats.values()), script_usec, other_usec,
            cpu["used_cpu_user"] + cpu["used_cpu_sys"])


def per_call(client, operation: Callable[[], object], count: int) -> tuple[float, float, float]:
    """Round trips, bytes sent and server-side commands per call of `operation` (after a first call:
    what a repeat call costs in steady state). The counts a worker owes the policies' totals are
    sent first, and their background flush (every quarter of a second at most: no decision's
    command) waits until the commands are counted."""
    from ratelimit_app.engine.tally import tally

    operation()
    tally.flush()
    with tally._flushing:  # a flush timed by an earlier call would otherwise land among the counted commands
        client.config_resetstat()
        before = server_commands(client)
        wire = Wire()
        with wire.watching():
            for _ in range(count):
                operation()
        commands = server_commands(client) - before
    return wire.trips / count, wire.bytes / count, commands / count


def _forked(target, args_of, processes: int) -> list:
    """Run `target(*args_of(), start, results)` in forked processes that start together; their results."""
    from django import db

    db.connections.close_all()  # each child opens its own database connection if it needs one
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=target, args=(*args_of(), start, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    collected = [results.get(timeout=180) for _ in workers]
    for worker in workers:
        worker.join()
    return collected


def _rate_worker(make_operation, seconds, start, results):
    operation = make_operation()
    operation()
    start.wait()
    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        operation()
        done += 1
    results.put(done)


def throughput(make_operation: Callable[[], Callable[[], object]], processes: int = 2, seconds: float = 2.0) -> float:
    """Operations per second of `processes` forked processes, each calling make_operation() once."""
    return sum(_forked(_rate_worker, lambda: (make_operation, seconds), processes)) / seconds


def _attempt_worker(make_attempt, attempts, start, results):
    attempt = make_attempt()
    start.wait()
    results.put(sum(bool(attempt()) for _ in range(attempts)))


def admitted(make_attempt: Callable[[], Callable[[], bool]], processes: int = 8, attempts: int = 100) -> int:
    """How many of processes x attempts were admitted (a fresh limit of 100 must admit exactly 100)."""
    return sum(_forked(_attempt_worker, lambda: (make_attempt, attempts), processes))


def _spread_worker(make_operation, number, processes, decisions, subjects, start, results):
    operation = make_operation()  # made (and warmed) before the start: connecting is not a decision
    first = number * subjects // processes  # the processes walk the same subjects, each from its own place
    order = [(first + i) % subjects for i in range(decisions)]
    samples = []
    clock = time.perf_counter
    start.wait()
    began = clock()
    with no_gc():
        for who in order:
            started = clock()
            operation(who)
            samples.append(clock() - started)
    results.put((began, clock(), samples))


def spread(make_operation: Callable[[], Callable[[int], object]], processes: int = 2, decisions: int = 10_000,
           subjects: int = 1_000) -> tuple[float, list[float]]:
    """The spread workload: `processes` forked processes, each making `decisions` calls of
    make_operation()(subject number) over `subjects` subjects in turn (so each subject's first decision
    is among them); decisions per second of the processes together, and every call's latency.
    CLOCK_MONOTONIC (perf_counter) is one clock for every process on Linux."""
    numbers = iter(range(processes))
    done = _forked(_spread_worker, lambda: (make_operation, next(numbers), processes, decisions, subjects), processes)
    began, ended = min(d[0] for d in done), max(d[1] for d in done)
    return processes * decisions / (ended - began), [sample for d in done for sample in d[2]]
