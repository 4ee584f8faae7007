"""The asyncio client's own write and read of a command (aclients.write, SentOnce._once), on real
servers: a write Redis does not take (stopped) times out and never runs, a reply Redis holds is an
outage within the socket timeout, a connection Redis closed between decisions is replaced, and the
commands the client keeps packed answer each subject its own count. The promises: no request hangs
on a stalled Redis, and every decision is counted once."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import RedisUnavailable, aclient, aclients
from tests.faults.test_connections import TIMEOUTS, counted, policy, use_server
from tests.faults.test_review_kept import _kill_all
from tests.helpers import check

pytestmark = pytest.mark.django_db


@pytest.fixture
def circuit():
    """The breaker's outages and errors so far; the next test starts from a closed circuit."""
    yield engine.breaker
    engine.breaker.reset()


@pytest.fixture
def stopped(private):
    """Stops the private Redis (SIGSTOP): it holds what it was sent, answering nothing; continued after."""
    stop = lambda: os.kill(private.process.pid, signal.SIGSTOP)
    yield stop
    os.kill(private.process.pid, signal.SIGCONT)


def test_a_write_redis_does_not_take_times_out_and_never_runs(settings, private, stopped):
    """A command larger than the socket buffers, to a stopped Redis: the command gives up at the socket
    timeout (Python 3.11 times the write out; 3.12+ queue the whole command and the read times out), the
    connection is closed (Redis never runs the part it got), and the next command is sent on a connection
    of its own."""
    use_server(settings, private.url, max_connections=2)

    async def run() -> tuple[Exception, int]:
        client = aclient()
        await client.execute_command("SET", "small", "1")  # the loop keeps this connection
        stopped()
        try:
            with pytest.raises(redis.TimeoutError) as raised:
                await client.execute_command("SET", "big", b"x" * (64 << 20))
        finally:
            os.kill(private.process.pid, signal.SIGCONT)
        return raised.value, await client.execute_command("EXISTS", "big")

    raised, exists = asyncio.run(run())
    assert exists == 0


def test_a_reply_redis_holds_is_an_outage_and_the_next_decision_is_counted(settings, private, stopped, circuit):
    """A stopped Redis holds a decision's reply: it is an outage at the socket timeout, not a request
    hanging; once Redis runs again the next decision is decided on a connection of its own."""
    use_server(settings, private.url, max_connections=2)
    settings.RATELIMIT_BREAKER_SECONDS = 0  # the next decision tries Redis again at once
    limits = policy(limit=100)
    who = check(limits, "ip:203.0.113.21")
    before = circuit.failures

    async def run() -> tuple[int, bool, int]:
        first = (await engine.adecide([who])).decisions[0].count
        stopped()
        try:
            with pytest.raises(RedisUnavailable):
                await asyncio.wait_for(engine.adecide([who]), 5 * TIMEOUTS["SOCKET_TIMEOUT"])
        finally:
            os.kill(private.process.pid, signal.SIGCONT)
        after = await engine.adecide([who])
        return first, after.allowed, after.decisions[0].count

    first, allowed, count = asyncio.run(run())
    # the held command reached Redis whole: it runs when Redis continues, and may have counted
    assert (first, allowed) == (1, True) and count in (2, 3)
    assert circuit.failures == before + 1


def test_a_reply_held_past_the_timeout_fails_alone_while_the_loop_is_answered(settings, private):
    """The loop's reads share one deadline timer (aclients.Deadlines): a command whose reply Redis holds,
    sent after another command's read armed the timer and ended, fails at the socket timeout instead of
    hanging, while the commands sent meanwhile on the pool's other connection are each answered; its
    connection is closed, so Redis hands it nothing afterwards."""
    use_server(settings, private.url, max_connections=2)

    async def run() -> tuple[int, int]:
        client = aclient()
        await client.execute_command("SET", "armed", "1")  # its read armed the timer, and ended
        await asyncio.sleep(0.05)  # the timer expires before the held read's deadline: it is armed anew
        held = asyncio.ensure_future(client.execute_command("BLPOP", "nothing", 0))  # Redis answers it never
        answered = 0
        while answered < 5:  # answered meanwhile; then no read but the held one, which the timer alone ends
            answered = await client.execute_command("INCR", "answered")
            await asyncio.sleep(0.01)
        with pytest.raises(redis.TimeoutError):
            await asyncio.wait_for(held, 5 * TIMEOUTS["SOCKET_TIMEOUT"])
        await client.execute_command("LPUSH", "nothing", "x")
        return answered, await client.execute_command("LLEN", "nothing")

    answered, left = asyncio.run(run())
    assert answered == 5
    assert left == 1  # no BLPOP of it blocked any longer: nothing took the element


def test_a_connection_killed_between_decisions_is_replaced_and_counts_once(settings, private, circuit):
    """CLIENT KILL of the loop's kept connection between two decisions: the second is written on a new
    connection, decided and counted once, and no outage is seen."""
    use_server(settings, private.url, max_connections=2)
    limits = policy(limit=100)
    who = check(limits, "ip:203.0.113.22")
    before = (circuit.failures, circuit.errors)

    async def run() -> list[int]:
        counts = [(await engine.adecide([who])).decisions[0].count]
        for _ in range(3):
            _kill_all(private.port)
            await asyncio.sleep(0.1)  # the loop reads the end of file of the connection it keeps
            counts.append((await engine.adecide([who])).decisions[0].count)
        return counts

    assert asyncio.run(run()) == [1, 2, 3, 4]
    assert counted(limits, "ip:203.0.113.22") == 4
    assert (circuit.failures, circuit.errors) == before


class Resetting:
    """A TCP proxy to Redis, in the test's loop, that can reset (RST) the connections it carries, as a
    load balancer or a NAT table dropping them does."""

    def __init__(self, port: int) -> None:
        self.port, self.carried = port, []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.carried.append((writer, upstream_writer))
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)

    def reset(self) -> None:
        for writer, upstream in self.carried:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            upstream.transport.abort()
        self.carried = []


def test_a_connection_reset_between_decisions_is_replaced_and_counts_once(settings, private, circuit):
    """The loop's kept connection reset (RST) between two decisions, which the loop reads as an error,
    not an end of file: the write finds the connection lost, the decision is sent on a new one, decided
    and counted once, and no outage is seen."""
    limits = policy(limit=100)
    who = check(limits, "ip:203.0.113.23")
    before = (circuit.failures, circuit.errors)
    proxy = Resetting(private.port)

    async def run() -> list[int]:
        use_server(settings, f"redis://127.0.0.1:{await proxy.start()}/0", max_connections=2)
        counts = [(await engine.adecide([who])).decisions[0].count]
        for _ in range(3):
            proxy.reset()
            await asyncio.sleep(0.1)  # the loop reads the reset of the connection it keeps
            counts.append((await engine.adecide([who])).decisions[0].count)
        proxy.server.close()
        return counts

    assert asyncio.run(run()) == [1, 2, 3, 4]
    assert (circuit.failures, circuit.errors) == before


def test_more_subjects_than_the_packed_commands_kept_each_get_their_own_answer(settings, private):
    """The clients keep the decisions packed within their share of RATELIMIT_CACHE_BYTES; past that, each
    subject is still answered with its own count."""
    # 12,000 decisions in a row: a timeout no pause of a busy machine reaches, so that none is an outage
    # here; on a server of its own, since django-redis would hand a LOCATION it met before the pool it
    # made then, with that cache's 0.25 s timeouts (check W008)
    use_server(settings, f"redis://127.0.0.1:{private.port}/0", timeouts={"SOCKET_CONNECT_TIMEOUT": 30,
                                                                          "SOCKET_TIMEOUT": 30})
    settings.RATELIMIT_CACHE_BYTES = 1 << 20  # room for a few hundred packed decisions
    limits = policy(limit=2, window=600)
    subjects = [f"ip:2001:db8::{i:x}" for i in range(1000)]

    async def run() -> tuple[dict, int]:
        answers = {who: [] for who in subjects}
        for _round in range(3):
            for who in subjects:
                answers[who].append((await engine.adecide([check(limits, who)])).allowed)
        return answers, len(aclients.packed)

    answers, kept = asyncio.run(run())
    assert all(seen == [True, True, False] for seen in answers.values())
    assert 0 < kept < len(subjects) and aclients.packed.held() <= aclients.packed.budget()
