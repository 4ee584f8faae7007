"""The Redis side keeps nothing between calls: the scripts' memory stays flat however many subjects
come, a restart loses only what Redis itself loses, and an earlier version of the engine can run
beside this one on the same Redis during a rolling deploy without either admitting too much."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from project.devredis import PrivateRedis
from ratelimit_app import engine
from ratelimit_app.engine import keys
from ratelimit_app.engine.arguments import Ask, live_member, script_call
from ratelimit_app.engine.scripts import scripts
from tests.helpers import check, policy

VM_GROWTH = 256 * 1024  # bytes the scripts' Lua VM may grow by over 40,000 fresh subjects
SHAPES = {
    "fixed_window": {"window": 3600},
    "sliding_window": {"window": 3600, "bucket_size": 60},
    "sliding_log": {"window": 3600},
    "token_bucket": {"window": 3600},
}


@pytest.fixture
def server(settings):
    """A Redis of the test's own (its Lua VMs measured alone), which the app uses."""
    private = PrivateRedis(options=("--appendonly", "yes", "--appendfsync", "always")).start()
    # every write waits for its fsync (appendfsync always): beside a loaded suite one took longer than the
    # demo's 0.25 s socket timeout (an outage, not the restart these tests are about)
    own = {**settings.CACHES["default"], "LOCATION": private.url}
    own["OPTIONS"] = {**own.get("OPTIONS", {}), "SOCKET_TIMEOUT": 10}
    settings.CACHES = {**settings.CACHES, "own": own}
    settings.RATELIMIT_CACHE = "own"
    yield private
    private.stop()


def vm_memory(functions: bool) -> int:
    memory = engine.client().info("memory")
    return memory["used_memory_vm_functions"] if functions else memory["used_memory_lua"]


def decide_fresh_subjects(url: str, limited, first: int, count: int, functions: bool) -> None:
    """One decision for each of `count` subjects never seen before, sent in pipelines (the scripts
    run as they do for requests; only the round trips are spared)."""
    client = redis.Redis.from_url(url, socket_timeout=60)  # a pipeline of 1,000 calls may take a while
    decide = scripts.get("decide", engine.client())
    for start in range(first, first + count, 1000):
        with client.pipeline(transaction=False) as pipe:
            for n in range(start, min(start + 1000, first + count)):
                script_keys, args, _ = script_call([check(limited, f"user:{n}")], Ask(None, False, 1, ""), False)
                if functions:
                    pipe.execute_command("FCALL", decide.function, len(script_keys), *script_keys, *args)
                else:
                    pipe.execute_command("EVALSHA", decide.sha, len(script_keys), *script_keys, *args)
            pipe.execute()


@pytest.mark.slow
@pytest.mark.parametrize("functions", [True, False], ids=["functions", "evalsha"])
@pytest.mark.parametrize("strategy", ["fixed_window", "token_bucket"])
def test_the_scripts_memory_stays_flat_over_40000_fresh_subjects(server, settings, strategy, functions):
    settings.RATELIMIT_REDIS_FUNCTIONS = "auto" if functions else False
    limited = policy(strategy=strategy, limit=1, **SHAPES[strategy])
    assert engine.decide([check(limited, "user:warm-up")]).allowed  # loads the code
    decide_fresh_subjects(server.url, limited, 0, 2_000, functions)  # and lets the VM settle
    before = vm_memory(functions)
    decide_fresh_subjects(server.url, limited, 2_000, 40_000, functions)
    decide_fresh_subjects(server.url, limited, 2_000, 1_000, functions)  # refused: the subjects are at their limit
    assert vm_memory(functions) - before <= VM_GROWTH


# --- restart ----------------------------------------------------------------------------------


def restart(private: PrivateRedis) -> None:
    """Stop the server as an operator would (it writes its append-only file) and start it again."""
    private.process.terminate()
    private.process.wait(timeout=10)
    private.start()


@pytest.mark.parametrize("strategy", list(SHAPES))
def test_a_restart_loses_nothing_redis_keeps(server, strategy):
    limited = policy(strategy=strategy, limit=5, **SHAPES[strategy])
    assert [engine.decide([check(limited)]).allowed for _ in range(3)] == [True] * 3
    restart(server)
    assert [engine.decide([check(limited)]).allowed for _ in range(3)] == [True, True, False]
    assert engine.decide([check(limited)], dry_run=True).decisions[0].count == 5


def test_a_server_that_lost_the_code_and_the_counters_starts_afresh_and_counts_once(server):
    limited = policy(limit=3, window=3600)
    assert engine.decide([check(limited)]).allowed
    engine.client().execute_command("FUNCTION", "FLUSH")
    engine.client().flushall()
    assert [engine.decide([check(limited)]).decisions[0].count for _ in range(3)] == [1, 2, 3]


# --- a rolling deploy: the previous engine beside this one -----------------------------------------

PREVIOUS = Path(__file__).parent / "fixtures" / "engine_v2_library.lua"  # its Functions library, as it loads


def previous_library() -> str:
    """The name the previous engine's library loads under (its first line: '#!lua name=...')."""
    return PREVIOUS.read_text().split("\n", 1)[0].split("name=")[1]


def previous_decide(limited, who: str = "ip:203.0.113.7", cost: int = 1) -> bool:
    """A decision as a worker of the previous version makes it: its keys (a fixed window's counter
    ended with 'f<window>'), its arguments, its library. Whether it admitted the request."""
    subject = check(limited, who).subject
    counter = keys.counter_key(limited, subject.key)
    if limited.strategy == "fixed_window":
        counter = counter[: -len(limited.shape)] + f"f{limited.window}"
    terms = (f"{limited.strategy} {limited.limit} {limited.window_ms} {limited.bucket_ms} 1 "
             f"{limited.totals_bucket_ms} 1000")
    reply = engine.client().execute_command(
        "FCALL", f"{previous_library()}_decide", 3, counter, keys.live_key(limited, 0), keys.totals_key(limited, 0),
        "", cost, "", terms, live_member(subject, limited.limit, limited),
    )
    return reply[1] == 0


@pytest.fixture
def previous(server):
    engine.client().execute_command("FUNCTION", "LOAD", PREVIOUS.read_text())


@pytest.mark.parametrize("strategy", ["sliding_window", "sliding_log", "token_bucket"])
def test_the_previous_engine_and_this_one_share_a_counter_and_together_admit_the_limit(previous, strategy):
    """Their counters are the same keys in the same format: a subject served by workers of both
    versions during the deploy is counted once, whichever worker serves it."""
    limited = policy(strategy=strategy, limit=10, **SHAPES[strategy])
    admitted = 0
    for n in range(30):
        if n % 2:
            admitted += previous_decide(limited)
        else:
            admitted += engine.decide([check(limited)]).allowed
    assert admitted == 10


def test_a_fixed_window_counter_of_the_previous_engine_is_never_read_as_this_ones(previous):
    """The previous engine's counter outlived its window by a second; this engine takes a counter that
    exists for the current window's, so it keeps counters of its own (another key shape): each
    engine counts its own requests exactly against the limit, and neither reads the other's."""
    limited = policy(limit=4, window=3600)
    assert [previous_decide(limited) for _ in range(5)] == [True] * 4 + [False]
    assert [engine.decide([check(limited)]).allowed for _ in range(5)] == [True] * 4 + [False]
    assert [previous_decide(limited) for _ in range(2)] == [False, False]
    counters = sorted(key.decode().rsplit(":", 1)[1] for key in engine.client().keys("rl:{*"))
    assert counters == ["f3600", "w3600"]
