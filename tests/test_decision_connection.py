"""The request path's connection: each thread that decides keeps one of the pool's connections
(decision_connection.decision_client), and that never costs a decision its answer: forked workers, many
threads, a pool with few connections, a changed cache setting, more subjects than a thread keeps
packed commands for."""

from __future__ import annotations

import threading

import pytest

from ratelimit_app import engine
from ratelimit_app.engine import decision_connection
from tests.helpers import check, in_processes, in_threads, policy

pytestmark = pytest.mark.django_db


def _counts(compiled, times: int) -> list[int]:
    return [engine.decide([check(compiled)]).decisions[0].count for _ in range(times)]


def _decide_in_child(compiled, start, results):
    start.wait()
    results.put(_counts(compiled, 300))


def test_forked_workers_decide_on_connections_of_their_own():
    compiled = policy(limit=10**6)
    assert _counts(compiled, 1) == [1]  # this thread keeps a connection before the fork
    per_child = in_processes(_decide_in_child, (compiled,), processes=3)
    # a socket shared with the parent or a sibling would mix up replies: counts out of order or lost
    assert all(counts == sorted(counts) for counts in per_child)
    assert sorted(c for counts in per_child for c in counts) == list(range(2, 902))


def test_threads_deciding_at_once_admit_exactly_the_limit():
    compiled = policy(limit=100)
    admitted, errors = in_threads(lambda: sum(engine.decide([check(compiled)]).allowed for _ in range(50)), threads=8)
    assert errors == [] and sum(admitted) == 100


def test_more_subjects_than_the_packed_commands_kept_each_get_their_own_answer(settings):
    settings.RATELIMIT_CACHE_BYTES = 1 << 20  # room for a few hundred packed decisions
    compiled = policy(limit=2, window=600, strategy="sliding_log")  # no window edge between the rounds
    subjects = [f"ip:198.51.100.{i % 250}" if i < 250 else f"ip:2001:db8::{i:x}" for i in range(1000)]
    answers = {who: [] for who in subjects}
    for _round in range(3):  # each subject's repeat request finds its own command, or packs it again
        for who in subjects:
            answers[who].append(engine.decide([check(compiled, who)]).allowed)
    assert all(seen == [True, True, False] for seen in answers.values())
    packed = decision_connection.packed
    assert 0 < len(packed) < len(subjects) and packed.held() <= packed.budget()


def test_a_pool_with_few_connections_keeps_room_for_its_other_users(settings, private):
    cache = settings.CACHES["default"]
    options = {**cache["OPTIONS"], "CONNECTION_POOL_KWARGS": {**cache["OPTIONS"].get("CONNECTION_POOL_KWARGS", {}),
                                                                 "max_connections": 2}}
    settings.CACHES = {**settings.CACHES, "small": {**cache, "LOCATION": private.url, "OPTIONS": options}}
    settings.RATELIMIT_CACHE = "small"
    compiled = policy(limit=10**6)
    ready, done, errors = threading.Barrier(3), threading.Event(), []

    def worker():
        try:
            engine.decide([check(compiled)])
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        ready.wait()
        done.wait()  # alive, as a server's threads are between requests

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    ready.wait()
    try:
        # two threads decided, and live on: the pool still has a connection for this one
        assert engine.decide([check(compiled)]).decisions[0].count == 3
        assert engine.client().ping()
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert errors == []


def test_a_changed_cache_setting_reaches_a_thread_that_decided_before(settings, private, redis_client):
    compiled = policy(limit=10**6)
    assert _counts(compiled, 2) == [1, 2]  # counted on the default server, through this thread's connection
    settings.CACHES = {**settings.CACHES, "other": {**settings.CACHES["default"], "LOCATION": private.url}}
    settings.RATELIMIT_CACHE = "other"
    assert _counts(compiled, 1) == [1]  # the other server: a counter of its own
    settings.RATELIMIT_CACHE = "default"
    assert _counts(compiled, 1) == [3]
