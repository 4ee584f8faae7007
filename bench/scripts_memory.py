"""The Redis side keeps nothing between calls: the Lua VMs' growth (functions and eval) over 40,000
fresh subjects a strategy, and how many libraries of ours a prune leaves beside an earlier version's."""

from __future__ import annotations

import os

import redis
from django.test.utils import override_settings

from bench.common import Results, client, policy, server
from ratelimit_app import engine, strategies
from ratelimit_app.engine.arguments import Ask, script_call
from ratelimit_app.engine.libraries import _library_names, prune
from ratelimit_app.engine.scripts import scripts
from ratelimit_app.subjects import Subject

FRESH = 40_000
SETTLE = 2_000  # decided first: the VM's own warm-up is not the subjects'
MODES = {"FCALL": "auto", "EVALSHA": False}
VM_FIELD = {"FCALL": "used_memory_vm_functions", "EVALSHA": "used_memory_lua"}
STALE_LIBRARY = "ratelimit_0000bench_stale"  # a library no worker says it runs, as an earlier version leaves
COLLECTOR = "bench_collect"  # not one of ours (no ratelimit_ prefix): a prune never sees it


def _fresh(limited, first: int, count: int, mode: str) -> None:
    """One decision for each of `count` subjects never seen before, in pipelines (the scripts run as for
    requests; only the round trips are spared)."""
    pipelined = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=60)  # 1,000 calls may take a while
    decide = scripts.get("decide", client())
    command = ("FCALL", decide.function) if mode == "FCALL" else ("EVALSHA", decide.sha)
    for start in range(first, first + count, 1000):
        with pipelined.pipeline(transaction=False) as pipe:
            for n in range(start, min(start + 1000, first + count)):
                who = Subject(f"{n:016x}", f"user {n}")
                script_keys, args, _ = script_call([engine.Check(limited, who, limited.limit)], Ask(None, False, 1, ""),
                                                   False)
                pipe.execute_command(*command, len(script_keys), *script_keys, *args)
            pipe.execute()
    pipelined.close()


def scripts_memory(results: Results) -> None:
    fresh = 4_000 if results.quick else FRESH
    counting = [s for s in results.decidable() if not strategies.get(s).holds and s != "calendar_quota"]
    for mode, setting in MODES.items():
        with override_settings(RATELIMIT_REDIS_FUNCTIONS=setting):
            for strategy in counting:
                limited = policy(strategy, limit=1)
                try:
                    engine.decide([engine.Check(limited, Subject("f" * 16, "warm"), 1)])  # loads the code
                except redis.ResponseError as error:  # no Functions on this server
                    results.vm_growth[(strategy, mode)] = f"n/a ({error})"
                    continue
                _fresh(limited, 0, SETTLE, mode)
                before = _kept(mode)
                _fresh(limited, SETTLE, fresh, mode)
                _fresh(limited, SETTLE, 1_000, mode)  # refused: those subjects are at their limit
                results.vm_growth[(strategy, mode)] = _kept(mode) - before
    try:
        server().execute_command("FUNCTION", "DELETE", COLLECTOR)
    except redis.ResponseError:  # never loaded: no Functions on this server
        pass
    results.vm_subjects = fresh
    results.libraries = _libraries_after_prune()


def _kept(mode: str) -> int:
    """The VM's memory after a full collection: what calls left behind (garbage is not kept state, and a
    reading without it moves with the incremental collector's phase by a few hundred KB)."""
    admin = server()
    if mode == "EVALSHA":
        admin.eval("collectgarbage('collect')", 0)
    else:  # the functions' VM is reached only by a function: one of the bench's, loaded for the reading
        admin.execute_command("FUNCTION", "LOAD", "REPLACE", f"#!lua name={COLLECTOR}\nredis.register_function("
                              f"'{COLLECTOR}', function() collectgarbage('collect') return 1 end)")
        admin.execute_command("FCALL", COLLECTOR, 0)  # (the copy it replaced is collected too: both readings hold one)
    return admin.info("memory")[VM_FIELD[mode]]


def _libraries_after_prune() -> str:
    """Load an earlier version's library (no worker's key names it), prune: how many of ours are left."""
    admin = server()
    try:
        admin.execute_command("FUNCTION", "LOAD", "REPLACE",
                              f"#!lua name={STALE_LIBRARY}\nredis.register_function('{STALE_LIBRARY}_f', "
                              "function() return 1 end)")
    except redis.ResponseError as error:
        return f"n/a ({error})"
    before = len(_library_names(admin))
    deleted, kept = prune(client())
    return f"{len(_library_names(admin))} (of {before}; deleted {', '.join(deleted) or 'none'}; kept {', '.join(kept)})"
