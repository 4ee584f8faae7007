"""The policy version in Redis: a new random token whenever policies change, compared by every worker.

A token, not a counter: a counter that restarts (FLUSHALL, a new server) could come back to a value
a worker already holds and hide a change; a fresh uuid never repeats, and a missing key reads as b''
which differs from every token.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import NamedTuple

from . import keys
from .admin_connection import admin_call
from ..conf import get_setting
from .circuit import RedisUnavailable, breaker
from .clients import client

logger = logging.getLogger("ratelimit_app")


def read_version() -> bytes:
    """The current token, on the request path's client (b'' when Redis holds none)."""
    return breaker.call(lambda: client().get(keys.version_key())) or b""


def current_version() -> bytes:
    """The current token, for a worker loading its index; a server holding none (new, flushed) is
    given one, so that losing it later shows as a change."""
    token = read_version()
    if not token:
        try:
            admin_call(lambda redis_client: redis_client.set(keys.version_key(), uuid.uuid4().hex, nx=True))
        except RedisUnavailable:
            return token
        token = read_version()
    return token


class WorkerReport(NamedTuple):
    """What a worker last said of the policies it enforces (in its heartbeat, every 10 s of use)."""

    worker: str  # host:pid
    said_at: float  # epoch seconds
    loaded_at: float  # when it loaded its policies, epoch seconds
    error: str  # why the database could not be read since, '' when it could


REPORTS_KEPT = 120.0  # seconds a worker's word is shown; older ones are dropped (the worker stopped)


def worker_reports() -> list[WorkerReport]:
    """Every worker's last word on its policies, newest first; older than REPORTS_KEPT: deleted."""
    raw = admin_call(lambda redis_client: redis_client.hgetall(keys.workers_key()))
    reports, gone = [], []
    for name, value in raw.items():
        said, loaded, error = (value.decode(errors="replace").split("|", 2) + ["", ""])[:3]
        try:
            report = WorkerReport(name.decode(errors="replace"), float(said), float(loaded), error)
        except ValueError:
            gone.append(name)
            continue
        (gone.append(name) if time.time() - report.said_at > REPORTS_KEPT else reports.append(report))
    if gone:
        admin_call(lambda redis_client: redis_client.hdel(keys.workers_key(), *gone))
    return sorted(reports, key=lambda report: -report.said_at)


def bump_version() -> None:
    """Tell every worker that policies changed; if Redis cannot be told now, keep trying in the background."""
    try:
        _write_token()
    except RedisUnavailable as error:
        logger.warning("ratelimit: could not announce a policy change yet, retrying: %s", error)
        _retry.start()


def _write_token() -> None:
    admin_call(lambda redis_client: redis_client.set(keys.version_key(), uuid.uuid4().hex))


class _Retry:
    """One background thread writing a new token once Redis answers again (one write covers every change)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.changes = 0  # changes not announced yet, counted so that one made during a write is not lost
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            self.changes += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="ratelimit-version-retry", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(get_setting("RATELIMIT_BREAKER_SECONDS"))
            announcing = self.changes
            try:
                _write_token()
            except RedisUnavailable:
                continue
            with self._lock:
                if self.changes == announcing:
                    self.changes, self.thread = 0, None
                    logger.warning("ratelimit: the policy change was announced to every worker")
                    return

    def pending(self) -> bool:
        return self.thread is not None


_retry = _Retry()


def pending_bump() -> bool:
    """Whether a change is still waiting to be announced (Redis was unreachable when it was made)."""
    return _retry.pending()
