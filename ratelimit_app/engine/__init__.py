"""The Redis side in one package, entered here: decide a request's checks in one Lua call, give places
back, and the clients, errors and circuit breaker the rest of the app sees."""

from __future__ import annotations

from ..values import NO_POLICIES, Check, Decision, Verdict
from .admin_connection import admin_call, admin_client
from .arguments import live_member
from .circuit import RedisCommandError, RedisUnavailable, breaker
from .aclients import aclient
from .clients import client, cluster_configured, is_cluster
from .decision import adecide, decide, deciding
from .decision_connection import decision_client
from .giveback import arelease, release
from .hooks import hooks
from .version import WorkerReport, worker_reports

__all__ = [
    "Check", "Decision", "Verdict", "NO_POLICIES", "RedisUnavailable", "RedisCommandError", "decide", "adecide",
    "deciding", "release", "arelease", "live_member", "client", "aclient", "decision_client", "admin_client",
    "admin_call", "is_cluster", "cluster_configured", "breaker", "hooks", "WorkerReport", "worker_reports",
]
