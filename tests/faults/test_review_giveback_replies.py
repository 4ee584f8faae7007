"""Give-backs written on a thread's kept connection whose replies are still due when the connection is
used next (read by its next command, before its own reply): connections killed or restarted in between,
several give-backs in a row, an error reply, a thread ending, a decision timing out, the engine's other
commands, many threads in a tight loop. The promises: every decision reads its own reply, a closed
connection is replaced (no outage), and once things settle no place stays held."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import RedisUnavailable, decision, decision_connection, giveback, keys
from ratelimit_app.engine.scripts import ENTRY_POINTS, scripts
from ratelimit_app.policies import compile_policy
from ratelimit_app.values import Held
from tests.faults.test_connections import QUEUED, circuit, use_server  # noqa: F401 - a fixture
from tests.faults.test_review_giveback import _held, _until
from tests.faults.test_review_kept import _kill_all
from tests.helpers import check, in_threads, make_policy, policy

pytestmark = pytest.mark.django_db


def _give_back(who, lease: str) -> None:
    engine.release([Held(who.policy, who.subject, lease, 1)])


@contextlib.contextmanager
def _unanswered(private, resume_after: float | None = 0.2):
    """Redis stopped while the block writes give-backs (their replies due), resumed `resume_after`
    seconds after the block ends (None: at once), as a busy server answers late."""
    os.kill(private.process.pid, signal.SIGSTOP)
    try:
        yield
    except BaseException:
        os.kill(private.process.pid, signal.SIGCONT)
        raise
    if resume_after is None:
        os.kill(private.process.pid, signal.SIGCONT)
    else:
        threading.Timer(resume_after, os.kill, (private.process.pid, signal.SIGCONT)).start()


def _held_unrun(admin, who, lease: str) -> None:
    """The give-back written, and held by Redis unrun (CLIENT PAUSE WRITE holds every EVAL)."""
    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    _give_back(who, lease)
    assert _until(lambda: any(c["cmd"] == "eval" for c in admin.client_list(_type="normal")), 2)


def _decided(*args, **kwargs):
    try:
        return engine.decide(*args, **kwargs)
    except RedisUnavailable as error:
        return error


def _settled(private) -> None:
    """What was owed is sent (the next give-back, or a timer within a second), nothing stays held, and the
    marks a give-back sent twice leaves expire with their counter."""
    engine.release([])
    assert _until(lambda: not giveback.owed.places), f"still owed: {giveback.owed.places}"
    assert _until(lambda: _held(private.port) == 0, 3), f"{_held(private.port)} places held after every request ended"
    admin = redis.Redis(port=private.port)
    assert all(admin.pttl(key) > 0 for key in admin.scan_iter(match="*:c*")), "a counter kept forever"
    admin.close()


@pytest.mark.parametrize("close", ["kill", "restart"])
def test_a_connection_closed_after_a_give_back_is_written_is_replaced_for_the_next_decision(settings, private, close):
    """The give-back is written, then Redis closes the connection before running it (CLIENT KILL of a
    client CLIENT PAUSE WRITE holds; a restart): the next decision is answered on a new connection, and
    the give-back, owed, is sent again."""
    use_server(settings, private.url, timeouts=QUEUED)
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    assert engine.decide([inflight], lease="a").allowed
    admin = redis.Redis(port=private.port)
    if close == "kill":
        _held_unrun(admin, inflight, "a")
        _kill_all(private.port)
        admin.execute_command("CLIENT", "UNPAUSE")
    else:
        os.kill(private.process.pid, signal.SIGSTOP)
        _give_back(inflight, "a")  # written, never read by this server
        private.process.kill()
        private.process.wait()
        private.start()
    admin.close()
    verdict = engine.decide([inflight], lease="b")  # raised RedisCommandError (a reply lost) if not replaced
    assert verdict.allowed
    _give_back(inflight, "b")
    _settled(private)


def test_a_kill_as_the_decision_starts_with_give_backs_due_is_a_new_connection(settings, private, monkeypatch):
    """CLIENT KILL lands as the decision takes its thread's connection, a give-back's reply due (Redis held
    the EVAL): the closed connection shows before the write (its end of file), so the decision goes on a
    new one, as a decision on a resting connection does, and the give-back is owed."""
    use_server(settings, private.url, timeouts=QUEUED)
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    assert engine.decide([inflight], lease="a").allowed
    admin = redis.Redis(port=private.port)
    _held_unrun(admin, inflight, "a")
    kept_client = decision.decision_client

    def killed_then_kept_client():
        redis_client = kept_client()
        _kill_all(private.port)
        admin.execute_command("CLIENT", "UNPAUSE")
        return redis_client

    monkeypatch.setattr(decision, "decision_client", killed_then_kept_client)
    verdict = engine.decide([inflight], lease="b")
    monkeypatch.undo()
    admin.close()
    assert verdict.allowed
    _give_back(inflight, "b")
    _settled(private)


def test_several_give_backs_in_a_row_then_a_decision_read_in_order_each_run_once(settings, private):
    """Three give-backs written while Redis is stopped, no decision between them: the next decision reads
    their three replies, then its own, on the same connection; none is sent twice."""
    use_server(settings, private.url, timeouts=QUEUED)
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    for lease in ("a", "b", "c"):
        assert engine.decide([inflight], lease=lease).allowed
    admin = redis.Redis(port=private.port)
    admin.config_resetstat()
    kept = engine.decision_client().connection._sock
    with _unanswered(private):
        for lease in ("a", "b", "c"):
            _give_back(inflight, lease)
    verdict = engine.decide([inflight], lease="d")
    assert verdict.allowed and verdict.decisions[0].count == 1, verdict  # a, b and c gone: d alone
    _give_back(inflight, "d")
    engine.decide([inflight], dry_run=True)
    assert engine.decision_client().connection._sock is kept, "the kept connection was replaced"
    assert giveback.owed.places == []
    assert admin.info("commandstats")["cmdstat_eval"]["calls"] == 4, "a give-back was sent twice"
    admin.close()
    _settled(private)


def test_a_give_back_answered_with_an_error_leaves_the_decision_its_own_reply(settings, private):
    """Another program wrote a string where a give-back's counter lives: its EVAL is answered WRONGTYPE.
    The next decision, reading that reply before its own, is answered with its own counts."""
    use_server(settings, private.url, timeouts=QUEUED)
    inflight = policy(strategy="concurrency", limit=5, window=600)
    bad, good = check(inflight, "ip:203.0.113.20"), check(inflight, "ip:203.0.113.21")
    log = check(policy(strategy="sliding_log", limit=100, window=3600), "ip:203.0.113.21")
    assert engine.decide([bad], lease="bad").allowed
    admin = redis.Redis(port=private.port)
    admin.set(keys.counter_key(bad.policy, bad.subject.key, keys.prefix()), "x")
    counts = []
    for n in range(3):
        with _unanswered(private):
            _give_back(bad, "bad")
        verdict = engine.decide([good, log], lease=f"good-{n}")
        counts.append([d.count for d in verdict.decisions])
        _give_back(good, f"good-{n}")
    admin.delete(keys.counter_key(bad.policy, bad.subject.key, keys.prefix()))
    admin.close()
    assert counts == [[1, 1], [1, 2], [1, 3]]
    _settled(private)


def test_a_decision_after_every_thread_takes_its_connection_anew_with_replies_due(settings, private):
    """A give-back's reply is due when every thread is told to take its connection anew (an outage, new
    settings): the old one goes back to the pool, the thread takes it again, and is answered on it."""
    use_server(settings, private.url, timeouts=QUEUED)
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    log = check(policy(strategy="sliding_log", limit=100, window=3600))
    assert engine.decide([inflight], lease="a").allowed
    with _unanswered(private):
        _give_back(inflight, "a")
    decision_connection.unpin()
    verdict = _decided([inflight, log], lease="b")
    assert not isinstance(verdict, Exception), f"the next user of the connection failed: {verdict!r}"
    assert verdict.allowed and [d.count for d in verdict.decisions] == [1, 1]
    _give_back(inflight, "b")
    _settled(private)


def test_a_connection_its_thread_left_with_replies_due_answers_a_thread_borrowing_per_call(settings, private):
    """A pool of 2: thread A keeps a connection (half the pool), thread B borrows one per call. A gives a
    place back while Redis is stopped and ends: its connection goes back to the pool with the reply due.
    B's next decision borrows that connection and is answered on it, not failed as a reply lost."""
    use_server(settings, private.url, timeouts=QUEUED, max_connections=2)
    for name in ENTRY_POINTS:  # registered now with a client of its own: no thread's client is kept alive by them
        scripts.get(name, decision_connection.SentOnce(connection_pool=redis.ConnectionPool(port=private.port)))
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    a_kept, b_pinned, a_ended = threading.Event(), threading.Event(), threading.Event()
    outcome: dict = {}

    def a():
        assert engine.decide([inflight], lease="a").allowed
        assert engine.decision_client().connection is not None
        a_kept.set()
        b_pinned.wait(5)
        with _unanswered(private, resume_after=None):
            _give_back(inflight, "a")

    def b():
        a_kept.wait(5)
        assert engine.decide([inflight], lease="b0").allowed
        outcome["borrows"] = getattr(engine.decision_client(), "connection", None) is None
        b_pinned.set()
        a_ended.wait(5)
        outcome["verdict"] = _decided([inflight], lease="b1")

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    threads[0].join()
    gc.collect()
    a_ended.set()
    threads[1].join()
    assert outcome["borrows"]
    verdict = outcome["verdict"]
    assert not isinstance(verdict, Exception), f"the next user of the connection failed: {verdict!r}"
    assert verdict.allowed
    for lease in ("b0", "b1"):
        _give_back(inflight, lease)
    _settled(private)


@pytest.mark.usefixtures("circuit")
def test_a_decision_timed_out_behind_give_backs_leaves_later_decisions_their_own_replies(settings, private):
    """Redis stopped past the socket timeout with two give-backs' replies due: the decision is an outage;
    once Redis runs again, the thread's next decisions read their own replies (counts 1, 2, 3), never
    the stale ones, and no place stays held."""
    use_server(settings, private.url)  # socket timeout 0.5 s
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    log = check(policy(strategy="sliding_log", limit=100, window=3600))
    for lease in ("a", "b"):
        assert engine.decide([inflight], lease=lease).allowed
    os.kill(private.process.pid, signal.SIGSTOP)
    try:
        for lease in ("a", "b"):
            _give_back(inflight, lease)
        with pytest.raises(RedisUnavailable):
            engine.decide([inflight], lease="c")
        _give_back(inflight, "c")  # failed open: given back all the same (owed while the circuit is open)
    finally:
        os.kill(private.process.pid, signal.SIGCONT)
    engine.breaker.reset()
    counts = [engine.decide([log]).decisions[0].count for _ in range(3)]
    assert counts == [1, 2, 3]
    _settled(private)


@pytest.mark.parametrize("call", ["dry run", "version", "quota", "function flushed", "evalsha noscript"])
def test_the_engines_other_commands_after_a_give_back_read_their_own_replies(settings, private, call):
    """After a give-back whose reply is due, the decision's other shapes and commands on the connection
    (a dry run, the version read, a quota's second call with the saved usage, FUNCTION LOAD after
    FUNCTION FLUSH, SCRIPT LOAD after NOSCRIPT) are each answered with their own replies."""
    use_server(settings, private.url, timeouts=QUEUED)
    settings.RATELIMIT_REDIS_FUNCTIONS = call != "evalsha noscript"
    inflight = check(policy(strategy="concurrency", limit=5, window=600))
    other = check(policy(strategy="sliding_log", limit=100, window=3600))
    if call == "quota":
        other = check(compile_policy(make_policy(name="monthly", strategy="calendar_quota", period="month",
                                                 time_zone="UTC", limit=10, window=1)))
    admin = redis.Redis(port=private.port)
    for n in range(3):
        assert engine.decide([inflight, other], lease=f"a{n}").allowed
        if call == "quota":
            admin.delete(keys.counter_key(other.policy, other.subject.key, keys.prefix()))  # the saved usage is read
        elif call == "function flushed":
            admin.function_flush()
        elif call == "evalsha noscript":
            admin.script_flush()
        with _unanswered(private):
            _give_back(inflight, f"a{n}")
        dry = call == "dry run"
        verdict = engine.decide([inflight, other], lease="" if dry else f"b{n}", dry_run=dry, version=call == "version")
        assert verdict.decisions[0].count == (0 if dry else 1), verdict  # a{n} given back first
        if call in ("dry run", "version"):  # the log counts each call but a dry run
            assert verdict.decisions[1].count == (n + 1 if dry else 2 * n + 2), verdict
            assert verdict.version == (admin.get(keys.version_key()) or b"" if not dry else None)
        engine.release([] if dry else [Held(inflight.policy, inflight.subject, f"b{n}", 1)])
    admin.close()
    _settled(private)


def test_many_threads_deciding_and_giving_back_in_a_tight_loop_admit_at_most_the_limit(settings, private):
    """8 threads, each taking a place of a limit of 3 and giving it back 200 times: never more than 3
    admitted at once, no decision failing open, and once they ended no place is held."""
    use_server(settings, private.url, timeouts=QUEUED)
    inflight = check(policy(strategy="concurrency", limit=3, window=600))
    lock, inside, most = threading.Lock(), [0], [0]

    def rounds() -> int:
        admitted = 0
        for n in range(200):
            lease = f"{threading.get_ident()}-{n}"
            if engine.decide([inflight], lease=lease).allowed:
                admitted += 1
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.001)  # the request's work: others decide meanwhile
                with lock:  # left before its give-back is written: never more inside than Redis holds
                    inside[0] -= 1
            _give_back(inflight, lease)
        return admitted

    results, errors = in_threads(rounds, threads=8)
    assert errors == []
    assert most[0] <= 3 and sum(results) >= 200
    _settled(private)


def test_the_first_thread_to_decide_gives_its_kept_connection_back_when_it_ends(settings, private):
    """The scripts are made with the process's first decision, on some thread: that thread's client must
    not stay alive in them once the thread ended, or its connection never goes back to the pool and
    keeps one of the pool's kept places for good (here the only one: the next thread borrowed per call)."""
    from ratelimit_app.engine.scripts import scripts

    use_server(settings, private.url, max_connections=2)  # half the pool: one connection kept
    limited = check(policy(limit=100))
    scripts._entries.clear()  # made anew by the first thread's decision
    kept = []

    def deciding() -> None:
        assert engine.decide([limited]).allowed
        kept.append(engine.decision_client().connection is not None)

    for _ in range(2):
        thread = threading.Thread(target=deciding)
        thread.start()
        thread.join()
        gc.collect()
    assert kept == [True, True]
