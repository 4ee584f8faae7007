"""Rows about scale: the live page over a million subjects, and decisions/s on a local Redis Cluster."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import time
from typing import Iterator

import redis
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from bench.common import Results, decide, policy, server, subject
from bench.measure import recording_commands
from ratelimit_app.engine import keys
from ratelimit_app.models import Policy
from ratelimit_app.subjects import Subject
from ratelimit_app.engine.tally import tally

BUSY = 150  # subjects given more requests than the rest: the top 100 of the live page must be theirs
BATCH = 2000  # commands per pipeline while seeding


def _seeded(number: int) -> Subject:
    return Subject(f"{number:016x}", f"ip:10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}")


@contextlib.contextmanager
def _recording_pipelines() -> Iterator[list[tuple]]:
    """The commands queued on pipelines meanwhile (the worker's tally writes the live index in one)."""
    queued: list[tuple] = []
    original = redis.client.Pipeline.execute_command

    def recorded(pipe, *args, **options):
        queued.append(args)
        return original(pipe, *args, **options)

    redis.client.Pipeline.execute_command = recorded
    try:
        yield queued
    finally:
        redis.client.Pipeline.execute_command = original


def seed(compiled, subjects: int) -> float:
    """Decide one request for each of `subjects` subjects with the engine's own commands and the
    worker's tally's (the live index, the totals), pipelined, at a fraction of the time; then BUSY of
    them get more requests through the engine itself, so that their entries move as the tally moves
    a busy subject's. Seconds taken."""
    template = subject("10.255.255.254")
    # the arguments naming the subject (its keys, its live index entry) change; the rest is sent as is
    # (a counter key carries the subject hash in its own form: keys.subject_part)
    marks = (template.key, keys.subject_part(template.key), template.display)
    tally.flush()
    with recording_commands() as sent, _recording_pipelines() as queued:
        decide([compiled], template)
        tally.flush()
    commands = [args for _, args in sent] + queued
    commands = [args for args in commands if any(isinstance(a, str) and any(m in a for m in marks) for a in args)]
    started = time.perf_counter()
    pipe = server().pipeline(transaction=False)
    for command in commands:
        varying = [(i, value) for i, value in enumerate(command) if isinstance(value, str) and any(m in value for m in marks)]
        args = list(command)
        for number in range(subjects):
            made = _seeded(number)
            for i, value in varying:
                args[i] = (value.replace(template.key, made.key)
                           .replace(keys.subject_part(template.key), keys.subject_part(made.key))
                           .replace(template.display, made.display))
            pipe.execute_command(*args)
            if number % BATCH == BATCH - 1:
                pipe.execute()
    pipe.execute()
    extra = [number for number in range(BUSY) for _ in range(number + 1)]  # busy subject i: i + 1 more
    random.Random(15).shuffle(extra)
    for number in extra:
        decide([compiled], _seeded(number))
    tally.flush()
    return time.perf_counter() - started


def _longest_command(redis_client, operation) -> tuple[int, str]:
    """The longest single Redis command (microseconds, SLOWLOG) while `operation` runs, and its name."""
    saved = {name: redis_client.config_get(name)[name] for name in ("slowlog-log-slower-than", "slowlog-max-len")}
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.config_set("slowlog-max-len", 1000)
    redis_client.slowlog_reset()
    try:
        operation()
        entries = redis_client.slowlog_get(1000)
    finally:
        for name, value in saved.items():
            redis_client.config_set(name, value)
    ignored = (b"SLOWLOG", b"CONFIG")
    timed = [(e["duration"], e["command"][:40].decode(errors="replace")) for e in entries
             if not e["command"].upper().startswith(ignored)]
    return max(timed, default=(0, "none"))


def live_page(results: Results, subjects: int) -> None:
    """The live page's JSON (top 100, busiest first) for one policy with `subjects` active subjects."""
    compiled = policy("fixed_window", limit=1000, window=3600, action="bench:live", save=True)
    seconds = seed(compiled, subjects)
    operator = get_user_model().objects.create_superuser("bench-operator", "bench@example.com", "bench-password-1")
    browser = Client()
    browser.force_login(operator)
    url = reverse("admin:ratelimit_app_policy_live", args=[compiled.id]) + "?format=json&limit=100"
    browser.get(url)  # the first read pays for imports and the session
    timings, answer = [], None
    for _ in range(5):
        started = time.perf_counter()
        answer = browser.get(url)
        timings.append(time.perf_counter() - started)
    longest, longest_name = _longest_command(server(), lambda: browser.get(url))
    shown = answer.json()["subjects"] if answer.status_code == 200 else []
    busiest = {_seeded(number).display for number in range(BUSY - 100, BUSY)}
    results.live = {
        "subjects": subjects, "seed_seconds": seconds, "status": answer.status_code, "ms": statistics.median(timings) * 1000,
        "shown": len(shown), "busiest_found": len(busiest & {entry["subject"] for entry in shown[:100]}),
        "longest_us": longest, "longest_command": longest_name,
    }
    Policy.objects.filter(pk=compiled.id).delete()
    operator.delete()


def cluster(results: Results) -> None:
    """Decisions/s against a local cluster of 1 master and of 3 masters, round trips per request on the cluster."""
    from tests.cluster import measure_scaling  # the test suite's local cluster harness

    scaling = measure_scaling(processes=2 if results.quick else 6, seconds=results.seconds)
    results.cluster = (
        f"{scaling.one_master:.0f} against 1 master, {scaling.three_masters:.0f} against 3 masters "
        f"({scaling.processes} client processes on {os.cpu_count()} cores); round trips per request: "
        f"{scaling.trips_one_shard:g} when its policies count one subject, {scaling.trips_two_shards:g} across two shards"
    )
