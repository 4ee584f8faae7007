"""Faults of the request path's connections, on real servers: connections killed or timed out while
decisions run, a pool smaller than the threads deciding, async views served by a WSGI server. The
promises: every decision counted at most once (and once when it was answered), no outage for a
connection Redis closed or a full pool, sockets bounded."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import RedisUnavailable, giveback
from ratelimit_app.engine.clients import socket_of
from ratelimit_app.engine.tally import tally
from tests.cluster import wait_for
from tests.helpers import check, in_threads
from tests.helpers import policy as any_policy
from tests.relay import Relay
from tests.servers import Server, manage, site_env

pytestmark = pytest.mark.django_db
TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5}
# a full pool is waited for up to the socket timeout: room for hundreds of callers queued on a busy machine;
# a connect on loopback took over 0.5 s beside a loaded suite (one caller failed open: 101 admitted)
QUEUED = {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 10}


def policy(**fields):
    """A sliding log by default: these tests wait on Redis for seconds, and a fixed window could start
    afresh in the middle of one (its counts would seem lost)."""
    return any_policy(**{"strategy": "sliding_log", "window": 3600, **fields})


def use_server(settings, url: str, pool_class: str = "", timeouts: dict | None = None, **pool_kwargs: object) -> None:
    """RATELIMIT_CACHE on `url`, as the README configures it (timeouts; pool options when given)."""
    options = {**(timeouts or TIMEOUTS), **({"CONNECTION_POOL_KWARGS": pool_kwargs} if pool_kwargs else {})}
    if pool_class:
        options["CONNECTION_POOL_CLASS"] = pool_class
    settings.CACHES = {**settings.CACHES, "faults": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url,
                                                     "OPTIONS": options}}
    settings.RATELIMIT_CACHE = "faults"


def counted(compiled, who: str = "ip:203.0.113.7") -> int:
    """What Redis holds for the subject, read without counting."""
    return engine.decide([check(compiled, who)], dry_run=True).decisions[0].count


@pytest.fixture
def circuit():
    """The breaker's outages and errors so far; the next test starts from a closed circuit."""
    yield engine.breaker
    engine.breaker.reset()


def _subject(task: int, i: int) -> str:
    return f"ip:10.{task}.{i // 250}.{i % 250}"  # a subject per decision: its count says how often it ran


def _decide_each(decide, task: int) -> tuple[list[str], int]:
    answered, failed = [], 0
    for i in range(DECISIONS):
        try:
            if decide(_subject(task, i)):
                answered.append(_subject(task, i))
        except RedisUnavailable:
            failed += 1  # a reply lost with its killed connection: the failure rule, not a second send
    return answered, failed


DECISIONS = 1500
KILLS = 40  # rounds of CLIENT KILL, 50 ms apart: 4 connections each, well under 5% of 4 x DECISIONS


def _in_threads(compiled) -> list[tuple[list[str], int]]:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda task: _decide_each(lambda who: engine.decide([check(compiled, who)]).allowed, task),
                             range(4)))


def _in_one_loop(compiled) -> list[tuple[list[str], int]]:
    async def decide_each(task: int) -> tuple[list[str], int]:
        answered, failed = [], 0
        for i in range(DECISIONS):
            try:
                if (await engine.adecide([check(compiled, _subject(task, i))])).allowed:
                    answered.append(_subject(task, i))
            except RedisUnavailable:
                failed += 1
        return answered, failed

    async def all_tasks():
        return await asyncio.gather(*(decide_each(task) for task in range(4)))

    return asyncio.run(all_tasks())


@pytest.mark.slow
@pytest.mark.parametrize("deciding", [_in_threads, _in_one_loop], ids=["threads", "event-loop"])
def test_client_kill_in_a_loop_counts_every_decision_at_most_once(settings, private, deciding):
    # of the 4 threads, 2 keep a connection and 2 borrow one per call: both paths are killed
    use_server(settings, private.url, max_connections=4)
    compiled = policy(limit=10**9)
    stop = threading.Event()

    def killer():
        # KILLS rounds at most: each takes at most the decisions in flight on the connections it kills, so
        # the failures stay bounded however long a loaded machine takes over the decisions
        admin = redis.Redis(port=private.port)
        for _ in range(KILLS):
            if stop.wait(0.05):
                break
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        admin.close()

    killing = threading.Thread(target=killer)
    killing.start()
    try:
        results = deciding(compiled)
    finally:
        stop.set()
        killing.join()
    counts = {_subject(task, i): counted(compiled, _subject(task, i)) for task in range(4) for i in range(DECISIONS)}
    answered, failed = [who for r in results for who in r[0]], sum(r[1] for r in results)
    assert [who for who, count in counts.items() if count > 1] == []  # none counted twice
    assert all(counts[who] == 1 for who in answered)  # each answered decision counted
    assert failed < 0.05 * len(counts)  # a killed connection is no outage: the circuit stayed closed


def test_connections_replaced_one_after_another_count_once_and_leave_no_file_behind(settings, private, circuit):
    """The check for a connection Redis closed keeps a poller with each socket it watches: replaced 30
    times, the kept connection counts each decision once, keeps one socket open, and the process holds
    no more files than after its first replacement (a poller or a socket kept per replacement would)."""
    use_server(settings, private.url)
    compiled = policy(limit=100)
    admin = redis.Redis(port=private.port)

    def replaced() -> None:
        admin.client_kill_filter(_type="normal", skipme=True)
        wait_for(lambda: len(admin.client_list()) == 1, 10, "Redis to close the kept connection")
        assert engine.decide([check(compiled)]).allowed

    outages = circuit.failures  # counted since the process started
    assert engine.decide([check(compiled)]).allowed
    replaced()
    tally.flush()  # the flush has its own connection from here: the files a worker keeps
    # and it waits until the end: a flush under way would reconnect, or open a second connection
    with tally._flushing:
        files = _open_files(os.getpid())
        for _ in range(30):
            replaced()
        assert counted(compiled) == 32
        assert circuit.failures == outages  # each replacement was no outage
        assert _open_files(os.getpid()) <= files
        assert len(admin.client_list()) <= 2  # the asking one, and the kept connection
    admin.close()


@pytest.mark.slow
def test_idle_timeouts_replace_connections_without_an_outage(settings, private, circuit, caplog):
    use_server(settings, private.url, max_connections=4)
    compiled = policy(limit=10**9)
    before = (circuit.failures, circuit.errors)
    admin = redis.Redis(port=private.port)
    admin.config_set("timeout", 1)
    # a long-lived loop running all along, as uvicorn's: its connections time out too
    loop = asyncio.new_event_loop()
    running = threading.Thread(target=loop.run_forever)
    running.start()

    async def decide_async(times: int) -> int:
        return sum([(await engine.adecide([check(compiled)])).allowed for _ in range(times)])

    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        try:
            for _round in range(3):
                # the tally's flush waits for the threads: each keeps one of the pool's 4 connections meanwhile
                with tally._flushing:
                    results, errors = in_threads(
                        lambda: sum(engine.decide([check(compiled)]).allowed for _ in range(20)), threads=4)
                assert errors == [] and sum(results) == 80
                assert asyncio.run_coroutine_threadsafe(decide_async(20), loop).result(timeout=30) == 20
                # every connection of the app rests past the timeout, and Redis closes it
                wait_for(lambda: len(admin.client_list()) == 1, 15, "Redis to close the idle connections")
        finally:
            asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(timeout=30)
            loop.call_soon_threadsafe(loop.stop)
            running.join()
            loop.close()
            admin.close()
    assert counted(compiled) == 3 * 100
    assert (circuit.failures, circuit.errors) == before
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.parametrize("pool", [{}, {"pool_class": "redis.BlockingConnectionPool", "timeout": 0.01}],
                         ids=["ConnectionPool", "BlockingConnectionPool"])
def test_a_bounded_pool_under_threads_admits_exactly_the_limit(settings, private, circuit, pool):
    use_server(settings, private.url, timeouts=QUEUED, max_connections=4, **pool)
    compiled = policy(limit=100)
    before = circuit.failures

    def decide_many():
        admitted = 0
        for _ in range(100):
            try:
                admitted += engine.decide([check(compiled)]).allowed
            except RedisUnavailable:
                admitted += 1  # failing open: let through, uncounted
        return admitted

    results, errors = in_threads(decide_many, threads=16)
    assert errors == [] and sum(results) == 100
    assert circuit.failures == before  # a full pool is no outage


def test_a_bounded_pool_under_one_event_loop_admits_exactly_the_limit(settings, private, circuit):
    use_server(settings, private.url, timeouts=QUEUED, max_connections=4)
    compiled = policy(limit=100)
    before = circuit.failures

    async def decide_one() -> bool:
        try:
            return (await engine.adecide([check(compiled)])).allowed
        except RedisUnavailable:
            return True  # failing open

    async def decide_many() -> list[bool]:
        return await asyncio.gather(*(decide_one() for _ in range(400)))

    assert sum(asyncio.run(decide_many())) == 100
    assert circuit.failures == before


def _connected(private) -> int:
    return redis.Redis(port=private.port).info("clients")["connected_clients"]


def test_event_loops_that_ended_leave_no_sockets_behind(settings, private):
    use_server(settings, private.url)
    compiled = policy(limit=10**6)

    async def decide() -> bool:
        return (await engine.adecide([check(compiled)])).allowed

    baseline = _connected(private)
    assert all(asyncio.run(decide()) for _ in range(300))
    assert counted(compiled) == 300
    # beside the sync client's connection (counted() reads through it): Redis sees the last loop's
    # socket close a moment after the loop has closed it
    wait_for(lambda: _connected(private) <= baseline + 1, 5, "the ended loops' sockets to close")


def _open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _worker_of(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.slow
def test_async_views_under_a_wsgi_server_keep_sockets_bounded(tmp_path, private):
    env = site_env(tmp_path / "site.sqlite3", REDIS_URL=private.url)
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", "from ratelimit_app.models import Policy\n"
           "Policy.objects.create(name='quote', action='quote', limit=10**6, window=3600, key='ip')")
    server = Server(env, workers=1)  # gunicorn's sync worker: each async view runs in a loop of its own
    try:
        worker = _worker_of(server.process.pid)

        def quotes(times: int) -> list[int]:
            codes = []
            for _ in range(times):
                try:
                    with urllib.request.urlopen(server.url + "/demo/quote/", timeout=10) as response:
                        codes.append(response.status)
                except urllib.error.HTTPError as error:
                    codes.append(error.code)
            return codes

        assert quotes(20) == [200] * 20
        clients, files = _connected(private), _open_files(worker)
        assert quotes(300) == [200] * 300
        wait_for(lambda: _connected(private) <= clients + 1, 5, "the ended loops' sockets to close")
        assert _open_files(worker) <= files + 1
    finally:
        server.stop()
    assert redis.Redis(port=private.port).dbsize() > 0  # the requests were decided in this Redis


def test_one_event_loop_keeps_its_connections_instead_of_checking_them_out_each_time(settings, private):
    """redis-py's asyncio checkout (a lock, a timeout, metrics hooks) cost a decision about 40 us: a
    loop's decisions and give-backs take the connection an earlier command of the loop read to the end.
    After a first one, 50 decisions of an in-flight policy, each given back, check out none. 4 at once
    (8 commands) check out at most one connection a command (which of them find a kept one, or a waiter's,
    depends on how the loop interleaves them), and every connection out of the pool is the loop's, kept."""
    from ratelimit_app.engine import aclient
    from ratelimit_app.values import Held

    use_server(settings, private.url, max_connections=4)
    inflight = any_policy(strategy="concurrency", limit=10, window=600)
    who = check(inflight)

    async def one(n: int) -> None:
        assert (await engine.adecide([who], lease=f"kept-{n}")).allowed
        await engine.arelease([Held(who.policy, who.subject, f"kept-{n}", 1)])
        # the give-back's reply is read by a task of its own, which then keeps the connection
        await asyncio.gather(*list(giveback._reading), return_exceptions=True)

    async def run() -> tuple[int, int]:
        await one(0)  # loads the library, and the loop's first connection
        pool = aclient().connection_pool
        checkouts, original = [0], pool.get_connection

        async def counted_checkout(*args, **kwargs):
            checkouts[0] += 1
            return await original(*args, **kwargs)

        pool.get_connection = counted_checkout
        for n in range(1, 51):
            await one(n)
        alone = checkouts[0]
        await asyncio.gather(*(one(n) for n in range(51, 55)))
        return alone, checkouts[0], len(pool._in_use_connections), len(aclient().kept)

    alone, at_once, out_of_pool, kept = asyncio.run(run())
    assert alone == 0 and at_once <= 8
    assert out_of_pool == kept <= 4
    assert counted(inflight) == 0  # every place given back


class HangsUp:
    """A TCP proxy to Redis, in a thread of its own, that hangs up the first `times` connections once
    their handshake came in, unanswered: a CLIENT KILL (or a proxy's restart) landing while redis-py
    opens a connection."""

    def __init__(self, port: int, times: int) -> None:
        self.port, self.times, self.accepted = port, times, 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._carry, "127.0.0.1", 0), self.loop).result()
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    def __exit__(self, *exc: object) -> None:
        # the connections it carries end with it: a task left pending is logged when collected, in
        # whichever later test that happens (and one asserting an empty log fails)
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    async def _close(self) -> None:
        self.server.close()
        carrying = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in carrying:
            task.cancel()
        await asyncio.gather(*carrying, return_exceptions=True)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.accepted <= self.times:
            await reader.read(65536)  # the handshake, never answered
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.port)
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()


@pytest.mark.parametrize("way", ["sync", "async"])
def test_a_connection_closed_while_it_opens_is_opened_again_without_an_outage(settings, private, circuit, way):
    """The first connection a worker opens is closed during its handshake: nothing of the decision was
    written, so it goes on a new connection; it is counted once and the circuit stays closed."""
    compiled = policy(limit=10)
    before = (circuit.failures, circuit.errors)
    with HangsUp(private.port, times=1) as url:
        use_server(settings, url)
        if way == "sync":  # a new thread: it takes its kept connection at its first decision
            def counts() -> list[int]:
                return [engine.decide([check(compiled)]).decisions[0].count for _ in range(2)]
            results, errors = in_threads(counts, 1)
            answers = results[0] if results else errors
        else:
            answers = asyncio.run(_counts_in_one_loop(compiled, 2))
    assert answers == [1, 2]
    assert (circuit.failures, circuit.errors) == before


async def _counts_in_one_loop(compiled, times: int) -> list[int]:
    return [(await engine.adecide([check(compiled)])).decisions[0].count for _ in range(times)]


def test_a_reply_cut_short_past_the_socket_timeout_is_an_outage_and_its_connection_is_closed(settings, private, circuit):
    """A decision's reply arrives in part, its rest held (a relay standing for a stalled network): the
    decision is an outage at the socket timeout, a timeout by name, instead of a request hanging; its
    connection is closed with the part read, and once answers flow the next decision reads its own reply."""
    settings.RATELIMIT_BREAKER_SECONDS = 0  # the next decision tries Redis again at once
    limits = policy(limit=100)
    who = check(limits, "ip:203.0.113.24")
    before = circuit.failures
    with Relay(private.port) as relay:
        use_server(settings, relay.url, max_connections=2)
        assert engine.decide([who]).decisions[0].count == 1
        relay.hold_answers(after=3)  # the reply's first bytes, never its end
        try:
            with pytest.raises(RedisUnavailable):
                engine.decide([who])
        finally:
            relay.release_answers()
        assert wait_for(lambda: relay.closed == 1, 5, "the connection read in part closed")
        after = engine.decide([who])
    assert circuit.failures == before + 1 and circuit.cause.startswith("TimeoutError: Timeout reading from")
    # the held command reached Redis whole: it ran, and counted
    assert (after.allowed, after.decisions[0].count) == (True, 3)


def test_a_message_pushed_ahead_of_a_decisions_reply_goes_to_redis_py_and_the_decision_reads_its_own(
    settings, private, circuit, caplog
):
    """RESP3 (redis-py 8's default) lets Redis push messages out of band on any connection (maintenance
    notices, invalidations, a subscribed channel's messages): one arriving just ahead of a decision's reply
    goes to redis-py's handlers, and the decision reads its own reply after it, on the connection it keeps."""
    limits = policy(limit=100)
    who = check(limits, "ip:203.0.113.25")
    with Relay(private.port) as relay:
        use_server(settings, relay.url, timeouts=QUEUED)  # the held reply is read well within the timeout
        assert engine.decide([who]).decisions[0].count == 1
        kept = engine.decision_client().connection
        assert kept.protocol in (3, "3")
        kept.send_command("SUBSCRIBE", "notices")
        kept.read_response(push_request=True)  # the subscription's confirmation, itself a push
        sock = socket_of(kept)
        relay.hold_answers()
        redis.Redis(port=private.port).publish("notices", "maintenance ahead")  # pushed, held by the relay
        releasing = threading.Timer(0.5, relay.release_answers)  # once the decision is written: its reply follows
        with caplog.at_level(logging.DEBUG, logger="push_response"):  # redis-py's handler of channel messages
            releasing.start()
            decided = engine.decide([who])  # in the thread that keeps the connection
            releasing.join()
        assert engine.decision_client().connection is kept and socket_of(kept) is sock, "the connection was replaced"
    assert decided.decisions[0].count == 2
    assert "maintenance ahead" in caplog.text
