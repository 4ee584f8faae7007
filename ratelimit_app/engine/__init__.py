"""The Redis side in one package, entered here and only here: decide a request's checks in one Lua call,
give places back, and the clients, errors, circuit breaker, keys, scripts, clock and tally the rest of
the app sees. Nothing outside the engine imports its modules (.importlinter): what it needs is named here.

The hooks (engine/hooks.py) are how it reaches the layers above it without importing them: events.py,
metrics.py and quotas.py set them as they load."""

from __future__ import annotations

from redis import Redis as Client  # the client admin_call hands its function, for the annotations above the engine
from redis.commands.core import Script

from ..values import NO_POLICIES, Check, Decision, Verdict
from .admin_connection import admin_call, admin_client
from .admin_connection import forget_client as forget_admin_client
from .arguments import figures, live_member
from .batches import run_each
from .circuit import RedisCommandError, RedisUnavailable, breaker
from .aclients import aclient, forget_aclients
from .clients import (
    ClusterConnectionFactory, client, cluster_configured, forget_clients, is_cluster, pool_retry, retries,
    uses_cluster_factory, when_flushed,
)
from .decision import adecide, decide, deciding
from .decision_connection import decision_client, unpin
from .giveback import arelease, owed, release
from .hooks import hooks
from .keys import counter_key, live_key, shard_of, totals_key
from .keys import shards as shard_count
from .keys import prefix as key_prefix
from .libraries import prune
from .reads import counters_now
from .scripts import now_arg, scripts
from .server_clock import server_clock, server_ms
from .tally import BLOCKED, NOW, tally
from .version import WorkerReport, bump_version, current_version, read_version, worker_reports

__all__ = [
    "Check", "Decision", "Verdict", "NO_POLICIES", "RedisUnavailable", "RedisCommandError", "decide", "adecide",
    "deciding", "release", "arelease", "live_member", "client", "aclient", "decision_client", "admin_client",
    "admin_call", "is_cluster", "cluster_configured", "breaker", "hooks",
    # the clients' settings, for the system checks and the connection factory django-redis is given
    "ClusterConnectionFactory", "pool_retry", "retries", "uses_cluster_factory", "when_flushed",
    # what a changed setting (runtime.py) makes it forget
    "forget_clients", "forget_aclients", "forget_admin_client", "unpin", "owed",
    # the keys, scripts and clock the live page, the deny cache and the operations read
    "counter_key", "live_key", "shard_of", "shard_count", "totals_key", "key_prefix", "figures", "run_each", "scripts",
    "now_arg", "prune", "server_clock", "server_ms", "tally", "BLOCKED", "NOW",
    "bump_version", "current_version", "read_version", "Client", "Script",
    # the workers' reports of the policies they hold (the live page, ratelimit status)
    "WorkerReport", "worker_reports",
    # the counters as Redis holds them now, for the saved quota usage
    "counters_now",
]
