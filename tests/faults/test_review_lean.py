"""Review of the lean request path (issue 54): the routes the middleware keeps as meeting no policy, the
policies and checks kept by route and address, and the wrap of django-redis' cache.clear(), attacked
with real Redis servers. What failed is kept here with its fix."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from django.core.cache import caches
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import doors, engine, lru
from ratelimit_app.lru import SLOT
from tests.faults.test_connections import TIMEOUTS, counted, policy, use_server
from tests.helpers import check, make_policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"
IP_SUBJECT = f"ip:{IP}"


def _hit():
    return ratelimit_app.hit(RequestFactory().get("/", REMOTE_ADDR=IP), "export")


def _own_cache(settings, url: str, name: str = "own") -> None:
    settings.CACHES = {**settings.CACHES, name: {**settings.CACHES["default"], "LOCATION": url}}


# --- cache.clear() forgets the refusals kept in memory only when Redis was emptied -------------------


def test_a_clear_that_fails_while_redis_is_down_keeps_the_refusals_in_memory(settings, private):
    """The refusals were forgotten by a clear() Redis never ran (the wrap forgot in a `finally`): with
    Redis down and failing open, the client Redis had refused was then let through."""
    _own_cache(settings, private.url)
    settings.RATELIMIT_CACHE = "own"
    make_policy(name="export", action="export", limit=1, key="ip")
    assert [_hit().allowed for _ in range(2)] == [True, False]
    private.stop()
    with pytest.raises(Exception):  # noqa: B017 - whatever django-redis raises: Redis did not empty
        caches["own"].clear()
    assert not _hit().allowed  # still refused from memory, as before the clear


def test_a_clear_whose_failure_django_redis_ignores_keeps_the_refusals_in_memory(settings, private):
    """IGNORE_EXCEPTIONS: the failed clear returns as if done; Redis was not emptied all the same."""
    _own_cache(settings, private.url)
    settings.CACHES["own"] = {**settings.CACHES["own"],
                              "OPTIONS": {**settings.CACHES["own"].get("OPTIONS", {}), "IGNORE_EXCEPTIONS": True}}
    settings.RATELIMIT_CACHE = "own"
    make_policy(name="export", action="export", limit=1, key="ip")
    assert [_hit().allowed for _ in range(2)] == [True, False]
    private.stop()
    assert caches["own"].clear() is None  # ignored
    assert not _hit().allowed


def test_clearing_a_cache_on_another_server_keeps_the_refusals_in_memory(settings, private):
    """A cache alias of another server (sessions, templates) emptied in production: the refusals of the
    app's server still hold. They were forgotten, which let a refused client through while the app's
    Redis was down."""
    _own_cache(settings, private.url)
    settings.RATELIMIT_CACHE = "own"
    make_policy(name="export", action="export", limit=1, key="ip")
    assert [_hit().allowed for _ in range(2)] == [True, False]
    private.stop()
    caches["default"].clear()  # the suite's Redis, up: not the server the app decides on
    assert not _hit().allowed


def test_a_clear_of_the_apps_server_through_another_alias_still_forgets_the_refusals(settings):
    """What the wrap is for holds: the same server emptied through any alias, the refusals go with it."""
    _own_cache(settings, settings.CACHES["default"]["LOCATION"], "again")
    make_policy(name="export", action="export", limit=1, key="ip")
    assert [_hit().allowed for _ in range(2)] == [True, False]
    caches["again"].clear()
    assert [_hit().allowed for _ in range(2)] == [True, False]


# --- what the doors keep by route is counted at what it weighs ---------------------------------------


def _weight(cache) -> int:
    """The bytes a cache's keys really take: the key tuples and the texts they hold (the values are
    shared: the index, the policies), with a dict slot each."""
    total = 0
    for key in cache.entries:
        parts = [key]
        while parts:
            part = parts.pop()
            if part is None:  # one object for the whole process (an urlconf left unset): nothing a key holds
                continue
            total += sys.getsizeof(part)
            if isinstance(part, tuple):
                parts.extend(part)
    return total + SLOT * len(cache.entries)


def test_the_routes_kept_for_paths_a_client_invents_stay_within_their_share_of_bytes(client, settings):
    """A client inventing paths of wide characters (an emoji is 4 bytes in a str) filled the caches of
    routes met by no policy, and of policies by route, past their shares: each counted a path's
    characters, not its bytes (4 times as many), nor the method's text."""
    settings.RATELIMIT_CACHE_BYTES = 8 * 2**20
    make_policy(name="export", action="export", limit=1, key="ip")  # an index with a policy: none of these
    wide = "\U0001F600" * 200
    for i in range(300):
        answer = client.generic("PROPFIND", f"/{wide}{i}/", REMOTE_ADDR=IP)
        assert answer.status_code == 404
    for cache in (doors._routes.unmatched, doors._routes.matched):
        assert cache.entries, cache.name  # the routes were kept
        assert _weight(cache) <= lru.share(cache.name), cache.name


# --- the loop's shared deadline timer ----------------------------------------------------------------


def test_a_reply_that_came_while_the_loop_was_held_leaves_the_next_decision_answered(settings, private):
    """The loop held past a read's deadline (a sync call in async code, a pause) while Redis answered: the
    timer, run before the read resumed, set TimeoutError on the stream the read then left with its reply.
    The connection was kept with that error in it, and the next decision on it, which Redis counted,
    failed as an outage."""
    use_server(settings, private.url)
    limited = policy(limit=100)

    async def run() -> list[int]:
        await engine.adecide([check(limited, IP_SUBJECT)])  # connected: the loop keeps the connection
        first = asyncio.ensure_future(engine.adecide([check(limited, IP_SUBJECT)]))
        for _ in range(5):
            await asyncio.sleep(0)  # written: its read waits, under its deadline
        time.sleep(3 * TIMEOUTS["SOCKET_TIMEOUT"])  # noqa: ASYNC251 - the loop held: Redis answers meanwhile
        counts = [(await first).decisions[0].count]
        counts.append((await engine.adecide([check(limited, IP_SUBJECT)])).decisions[0].count)
        return counts

    assert asyncio.run(run()) == [2, 3]
    assert counted(limited, IP_SUBJECT) == 3
