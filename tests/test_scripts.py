"""How the Lua code reaches Redis: a Functions library called with FCALL where the server has
Functions, EVALSHA elsewhere or when RATELIMIT_REDIS_FUNCTIONS is False; both recover by themselves
when the server lost the code (FUNCTION FLUSH, SCRIPT FLUSH, restart), counting each decision once.

FUNCTION FLUSH and SCRIPT FLUSH empty a whole server, so these tests run against servers of their own.
"""

from __future__ import annotations

import re

import pytest

from project.devredis import PrivateRedis
from ratelimit_app import engine
from ratelimit_app.engine import arguments
from ratelimit_app.engine.batches import run_each
from ratelimit_app.engine.scripts import scripts
from ratelimit_app.engine.tally import tally
from tests.helpers import check, count_round_trips, policy

T0 = 1_700_000_000.0


def use(settings, server: PrivateRedis) -> None:
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": server.url}}
    settings.RATELIMIT_CACHE = "own"


@pytest.fixture
def server(settings):
    """A Redis of this test's own, which the app uses."""
    private = PrivateRedis().start()
    use(settings, private)
    yield private
    private.stop()


@pytest.fixture
def old_server(settings):
    """A Redis that answers FCALL and FUNCTION as an older server does: unknown commands."""
    private = PrivateRedis(options=("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")).start()
    use(settings, private)
    yield private
    private.stop()


def reset_stats() -> None:
    """Zero the server's command counts, and forget the counts this process owes the totals (the
    background flush's FCALL must not count as a decision's, nor load the library before it)."""
    tally.discard()
    engine.client().config_resetstat()


def calls(command: str) -> int:
    return engine.client().info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def count_of(verdict) -> int:
    return verdict.decisions[0].count


def test_the_library_is_named_after_its_source():
    assert re.fullmatch(r"ratelimit_[0-9a-f]{12}", scripts.library_name)
    assert scripts.library.startswith(f"#!lua name={scripts.library_name}\n")
    assert f"'{scripts.library_name}_decide'" in scripts.library


def test_by_default_a_decision_is_one_fcall_on_a_server_with_functions(server):
    limited = policy(limit=5, window=86_400)
    engine.decide([check(limited)])  # loads the library
    assert engine.client().function_list(library=scripts.library_name)
    reset_stats()
    assert count_of(engine.decide([check(limited)])) == 2
    assert (calls("fcall"), calls("evalsha"), calls("eval")) == (1, 0, 0)


def test_with_functions_off_a_decision_is_one_evalsha(server, settings):
    settings.RATELIMIT_REDIS_FUNCTIONS = False
    limited = policy(limit=5, window=86_400)
    engine.decide([check(limited)])  # loads the script
    reset_stats()
    assert count_of(engine.decide([check(limited)])) == 2
    assert (calls("fcall"), calls("evalsha")) == (0, 1)


def test_a_decision_after_function_flush_loads_the_library_and_counts_once(server):
    limited = policy(limit=5, window=86_400)
    assert count_of(engine.decide([check(limited)])) == 1
    engine.client().function_flush()
    reset_stats()
    with tally._flushing:  # the background flush of the totals, an FCALL too, waits until counted
        assert count_of(engine.decide([check(limited)])) == 2
        assert (calls("fcall"), calls("function|load")) == (2, 1)  # the one refused, sent again once
    assert count_of(engine.decide([check(limited)])) == 3


@pytest.mark.django_db(transaction=True)
async def test_an_async_decision_after_function_flush_loads_the_library_and_counts_once(server):
    limited = policy(limit=5, window=86_400)
    assert count_of(await engine.adecide([check(limited)])) == 1
    engine.client().function_flush()
    reset_stats()
    with tally._flushing:  # the background flush of the totals, an FCALL too, waits until counted
        assert count_of(await engine.adecide([check(limited)])) == 2
        assert (calls("fcall"), calls("function|load")) == (2, 1)  # the one refused, sent again once


def pipelined(limited, who: list[str]) -> list[int]:
    client = engine.client()
    given = arguments.Ask(T0, False, 1, "")
    batch = [arguments.script_call([check(limited, subject)], given, False)[:2] for subject in who]
    # decide.lua's reply: now, then the policy's count (-1 - count when exceeded), reset, retry or before
    return [reply[1] for reply in run_each(client, scripts.get("decide_with", client), batch)]  # a given time


def test_a_pipeline_after_function_flush_loads_the_library_once_and_counts_once(server):
    limited = policy(limit=5, window=86_400)
    who = ["ip:192.0.2.1", "ip:192.0.2.2"]
    assert pipelined(limited, who) == [1, 1]
    engine.client().function_flush()
    reset_stats()
    assert pipelined(limited, who) == [2, 2]
    assert (calls("fcall"), calls("function|load")) == (4, 1)


def test_with_functions_off_a_decision_after_script_flush_reloads_the_script_and_counts_once(server, settings):
    settings.RATELIMIT_REDIS_FUNCTIONS = False
    limited = policy(limit=5, window=86_400)
    assert count_of(engine.decide([check(limited)])) == 1
    engine.client().script_flush()
    assert count_of(engine.decide([check(limited)])) == 2
    engine.client().script_flush()
    assert pipelined(limited, ["ip:192.0.2.1", "ip:192.0.2.2"]) == [1, 1]
    engine.client().script_flush()
    assert pipelined(limited, ["ip:192.0.2.1", "ip:192.0.2.2"]) == [2, 2]
    assert calls("fcall") == 0


@pytest.mark.django_db(transaction=True)
async def test_with_functions_off_an_async_decision_after_script_flush_counts_once(server, settings):
    settings.RATELIMIT_REDIS_FUNCTIONS = False
    limited = policy(limit=5, window=86_400)
    assert count_of(await engine.adecide([check(limited)])) == 1
    engine.client().script_flush()
    assert count_of(await engine.adecide([check(limited)])) == 2
    assert calls("fcall") == 0


def test_a_server_without_functions_is_asked_once_then_gets_evalsha(old_server):
    limited = policy(limit=5, window=86_400)
    assert count_of(engine.decide([check(limited)])) == 1  # FCALL: unknown command; EVALSHA, NOSCRIPT; loaded
    assert pipelined(limited, ["ip:192.0.2.2"]) == [1]  # decide_with's script (a given time): NOSCRIPT; loaded
    reset_stats()
    with count_round_trips() as trips:
        assert count_of(engine.decide([check(limited)])) == 2
        assert pipelined(limited, ["ip:192.0.2.1"]) == [1]
    assert trips[0] == 2 and calls("evalsha") == 2  # FCALL is not tried again


@pytest.mark.django_db(transaction=True)
async def test_an_async_client_falls_back_to_evalsha_on_a_server_without_functions(old_server):
    limited = policy(limit=5, window=86_400)
    assert count_of(await engine.adecide([check(limited)])) == 1
    assert count_of(await engine.adecide([check(limited)])) == 2


def test_a_user_whose_acl_refuses_functions_gets_evalsha(server):
    engine.client().execute_command("ACL", "SETUSER", "default", "-fcall", "-function")
    limited = policy(limit=5, window=86_400)
    assert [count_of(engine.decide([check(limited)])) for _ in range(2)] == [1, 2]
    assert calls("evalsha") >= 2


def test_more_terms_than_the_library_keeps_each_decide_at_their_own_limit(redis_client):
    # a policy's terms (one text per limit) are read once per library load and kept, up to a bound
    # after which the library starts over: each limit must still be the one that decides
    limited = policy(limit=5, window=86_400)
    seen = []
    for limit in [*range(1, 1101), 1, 2]:  # past terms.lua's KEEP, then the first ones again
        who = f"ip:terms-{len(seen)}"
        seen.append([engine.decide([check(limited, who, limit=limit)], now=T0).allowed for _ in range(2)])
    assert seen[0] == seen[-2] == [True, False] and seen[1] == seen[-1] == [True, True]
    assert all(answers == [True, True] for answers in seen[1:-2])
