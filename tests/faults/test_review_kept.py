"""The asyncio client of decisions keeps a connection read to the end for its loop's next command:
such a kept connection closed by Redis (CLIENT KILL, an idle timeout), a command cancelled while its
reply is unread, a pool of one shared by many tasks, a loop closing with connections kept. The
promises: every decision and give-back counted exactly, none failing open, no socket left open."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from ratelimit_app import engine
from ratelimit_app.engine import RedisCommandError, RedisUnavailable, aclient, giveback
from ratelimit_app.engine.keys import subject_part
from ratelimit_app.values import Held
from tests.faults.test_connections import QUEUED, use_server
from tests.helpers import check
from tests.helpers import policy as any_policy

pytestmark = pytest.mark.django_db


def _held(inflight, who) -> int:
    return engine.decide([check(inflight, who)], dry_run=True).decisions[0].count


async def _read_give_backs() -> None:
    await asyncio.gather(*list(giveback._reading), return_exceptions=True)


def _kill_all(port: int) -> None:
    admin = redis.Redis(port=port)
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    admin.close()


@pytest.mark.parametrize("close", ["kill", "idle"])
def test_a_give_back_on_a_kept_connection_redis_closed_is_taken_at_once(settings, private, close):
    """A kept connection closed by Redis (CLIENT KILL, or `timeout 1` idle): the next give-back is
    written on a connection that is open, so Redis takes it then, not a second later from the owed."""
    use_server(settings, private.url, max_connections=2)
    inflight = any_policy(strategy="concurrency", limit=10, window=600)
    who = check(inflight, "ip:203.0.113.9")

    async def run() -> tuple[int, int]:
        assert (await engine.adecide([who], lease="a")).allowed
        assert aclient().kept  # the decision's connection is kept
        if close == "kill":
            _kill_all(private.port)
        else:
            redis.Redis(port=private.port).config_set("timeout", 1)
        await asyncio.sleep(0.3 if close == "kill" else 2.5)
        await engine.arelease([Held(who.policy, who.subject, "a", 1)])
        await _read_give_backs()
        return _held(inflight, "ip:203.0.113.9"), len(giveback.owed.places)

    held, owed = asyncio.run(run())
    assert (held, owed) == (0, 0)


def test_a_decision_cancelled_with_its_reply_unread_leaves_the_next_its_own_reply(settings, private):
    """CLIENT PAUSE holds a decision's reply; it is cancelled. The next decisions read their own replies
    (counts 2, 3, ...), never the cancelled one's, and nothing is kept with a reply unread."""
    use_server(settings, private.url, timeouts=QUEUED, max_connections=1)
    limits = any_policy(strategy="sliding_log", limit=100, window=3600)
    who = check(limits, "ip:203.0.113.10")
    admin = redis.Redis(port=private.port)

    async def run() -> list[int]:
        assert (await engine.adecide([who])).decisions[0].count == 1
        admin.execute_command("CLIENT", "PAUSE", 300, "ALL")
        task = asyncio.ensure_future(engine.adecide([who]))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)  # unpaused: the cancelled command's reply is on its way, or read
        counts = [(await engine.adecide([who])).decisions[0].count for _ in range(3)]
        return counts

    counts = asyncio.run(run())
    admin.close()
    first = counts[0]
    assert first in (2, 3) and counts == [first, first + 1, first + 2]
    assert _held(limits, "ip:203.0.113.10") == first + 2


def test_a_pool_of_one_shared_by_many_tasks_deciding_and_giving_back(settings, private):
    """max_connections=1, 60 tasks each taking a place and giving it back 5 times: none fails open
    (PoolFull), and every place is given back once the replies were read."""
    use_server(settings, private.url, timeouts=QUEUED, max_connections=1)
    inflight = any_policy(strategy="concurrency", limit=1000, window=600)

    async def one(n: int) -> int:
        who = check(inflight, f"ip:10.0.{n // 250}.{n % 250}")
        allowed = 0
        for r in range(5):
            allowed += (await engine.adecide([who], lease=f"{n}-{r}")).allowed
            await engine.arelease([Held(who.policy, who.subject, f"{n}-{r}", 1)])
        return allowed

    async def run() -> int:
        allowed = sum(await asyncio.gather(*(one(n) for n in range(60))))
        await _read_give_backs()
        return allowed

    allowed = asyncio.run(run())
    assert allowed == 300
    assert sum(_held(inflight, f"ip:10.0.{n // 250}.{n % 250}") for n in range(60)) == 0
    assert giveback.owed.places == []


def test_a_loop_closing_with_kept_connections_closes_their_sockets(settings, private):
    """20 loops, each deciding with 3 connections kept when it ends: Redis lists none of their sockets."""
    use_server(settings, private.url, max_connections=4)
    limits = any_policy(strategy="sliding_log", limit=10000, window=3600)
    who = check(limits, "ip:203.0.113.11")
    opened: set[str] = set()  # the loops' sockets, as Redis names them (the address of their end)

    async def run() -> int:
        await asyncio.gather(*(engine.adecide([who]) for _ in range(3)))
        for connection in aclient().kept:
            host, port = connection._writer.get_extra_info("sockname")[:2]
            opened.add(f"{host}:{port}")
        return len(aclient().kept)

    kept = [asyncio.run(run()) for _ in range(20)]
    assert max(kept) >= 2 and len(opened) >= 2
    admin = redis.Redis(port=private.port)
    for _ in range(100):  # Redis sees the closes as it gets to them
        if not opened & {c["addr"] for c in admin.client_list(_type="normal")}:
            break
        time.sleep(0.05)
    assert opened & {c["addr"] for c in admin.client_list(_type="normal")} == set()
    admin.close()


def test_a_wrongtype_reply_leaves_the_connection_clean(settings, private):
    """Another program wrote a string where a decision's sorted set lives: that decision fails, and the
    next ones (on the same loop, one connection) read their own replies."""
    use_server(settings, private.url, timeouts=QUEUED, max_connections=1)
    limits = any_policy(strategy="sliding_log", limit=100, window=3600)
    good, bad = check(limits, "ip:203.0.113.12"), check(limits, "ip:203.0.113.13")
    admin = redis.Redis(port=private.port)

    async def run() -> list[int]:
        await engine.adecide([good])
        await engine.adecide([bad])  # its counter, which another program then overwrites with a string
        keys = list(admin.scan_iter(match=f"*{subject_part(bad.subject.key)}*"))
        for key in keys:
            admin.set(key, "x")
        assert keys
        with pytest.raises(RedisCommandError, match="WRONGTYPE"):
            await engine.adecide([bad])
        return [(await engine.adecide([good])).decisions[0].count for _ in range(3)]

    counts = asyncio.run(run())
    admin.close()
    assert counts == [2, 3, 4]


@pytest.mark.parametrize("functions", [True, False])
def test_many_tasks_cancelled_under_a_paused_redis_on_a_pool_of_two(settings, private, functions):
    """60 tasks deciding and giving back on a pool of 2; CLIENT PAUSE, then half of them cancelled: once
    the rest ended and what was owed is sent, none failed open and no place stays held."""
    use_server(settings, private.url, timeouts=QUEUED, max_connections=2)
    settings.RATELIMIT_REDIS_FUNCTIONS = functions
    inflight = any_policy(strategy="concurrency", limit=1000, window=600)
    admin = redis.Redis(port=private.port)

    async def one(n: int) -> int:
        who = check(inflight, f"ip:10.1.{n // 250}.{n % 250}")
        failed = 0
        for r in range(4):
            try:
                await engine.adecide([who], lease=f"{n}-{r}")
            except (RedisUnavailable, RedisCommandError):
                failed += 1  # failed open (the place, if taken, is given back all the same)
            await engine.arelease([Held(who.policy, who.subject, f"{n}-{r}", 1)])
            await asyncio.sleep(0)
        return failed

    async def run() -> int:
        tasks = [asyncio.ensure_future(one(n)) for n in range(60)]
        await asyncio.sleep(0.01)
        # shorter than any socket timeout a client of the suite has (0.25 s): a pause, never an outage
        admin.execute_command("CLIENT", "PAUSE", 150, "ALL")
        await asyncio.sleep(0.05)
        for task in tasks[::2]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await _read_give_backs()
        return sum(r for r in results if isinstance(r, int))

    failed = asyncio.run(run())
    assert failed == 0
    for _ in range(50):  # the owed are sent by a timer within a second
        if not giveback.owed.places and giveback.owed._timer is None:
            break
        asyncio.run(asyncio.sleep(0.1))
    admin.close()
    assert sum(_held(inflight, f"ip:10.1.{n // 250}.{n % 250}") for n in range(60)) == 0


def test_a_decision_cancelled_while_giving_its_connection_to_a_waiting_one_does_not_lose_it(settings, private):
    """A pool of one: a decision read its reply and gives its connection to one waiting for the pool,
    but must wait for the pool's lock (held here, as by a busy checkout), and is cancelled there (its
    request's client left). The connection still reaches the pool: the waiting decision and the next
    one are answered (no PoolFull, failing open), and each counted once."""
    use_server(settings, private.url, max_connections=1)
    limits = any_policy(strategy="sliding_log", limit=100, window=3600)
    who = check(limits, "ip:203.0.113.15")

    async def run() -> list:
        await engine.adecide([who])  # the loop's one connection, kept
        lock = aclient().connection_pool._condition
        await lock.acquire()
        first = asyncio.ensure_future(engine.adecide([who]))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(engine.adecide([who]))
        await asyncio.sleep(0.1)  # the first read its reply, and waits for the lock to give its connection
        assert aclient().waiting == 1 and not first.done()
        first.cancel()
        await asyncio.sleep(0)
        lock.release()
        answered = await asyncio.gather(waiting, return_exceptions=True)
        return [*answered, await engine.adecide([who])]

    verdicts = asyncio.run(run())
    assert [getattr(verdict, "allowed", verdict) for verdict in verdicts] == [True, True]
    assert _held(limits, "ip:203.0.113.15") == 4
