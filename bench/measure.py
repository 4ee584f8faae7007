"""Measuring helpers: latency percentiles, round trips and bytes on the wire, server-side commands,
decisions per second in several processes, and exactness under concurrency."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import statistics
import time
from typing import Callable, Iterator

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

        def counting(self, command, check_health=True):
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


def outside_redis(operation: Callable[[], object], count: int, warmup: int = 200) -> float:
    """Mean microseconds per call spent outside redis-py's script call (the round trip, packing and
    parsing included): the Python a path adds around its one round trip, free of the network's noise."""
    from redis.commands.core import Script

    for _ in range(warmup):
        operation()
    inside = [0.0]
    original = Script.__call__

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - started

    Script.__call__ = timed
    try:
        with no_gc():
            started = time.perf_counter()
            for _ in range(count):
                operation()
            total = time.perf_counter() - started
    finally:
        Script.__call__ = original
    return (total - inside[0]) / count * 1e6


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


def server_commands(client) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat"))


def per_call(client, operation: Callable[[], object], count: int) -> tuple[float, float, float]:
    """Round trips, bytes sent and server-side commands per call of `operation`."""
    operation()
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
