"""Helpers for your own tests: forget what the app keeps in a process, forget counters, install a
policy for the length of a block."""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import events, giveback, keys, policies, runtime, subjects
from .breaker import breaker, outage
from .connection import client as redis_client
from .deny_cache import deny_cache
from .models import Policy
from .policies import policies_changed
from .quotas import saver
from .tally import tally


def reset() -> None:
    """Forget everything ratelimit_app keeps in this process, as if it had just started: the policy
    index (loaded again at the next request), the code policies written to the database (written
    again), refusals kept in memory, the circuit breaker and what the logs already said, counts not
    yet added to the policies' totals, in-flight places still to give back, the Redis clients and
    kept connections, whatever was read from the settings, and quota usage not saved yet. Redis and
    the database are left as they are (see reset_counters()).

    Call it between tests that roll the database back or empty Redis, e.g. in an autouse fixture.
    """
    for _settings, forget in runtime.FORGET:  # settings, clients, kept connections, code policies' sync
        forget()
    policies.forget_index()
    deny_cache.clear()
    breaker.reset()
    outage.reset()
    events.availability.reset()
    subjects.forget_warning()  # said once a process: about a request without a client address
    tally.discard()  # waits for a flush under way: what it sends lands before the caller empties Redis
    saver.discard()  # quota usage not saved yet (what is saved stays: see reset_counters())
    giveback.owed.forget()  # places still to give back, of counters the caller is about to empty


def reset_counters() -> int:
    """Delete every key under RATELIMIT_KEY_PREFIX (SCAN is fine here: this is for tests); returns how many."""
    client = redis_client()
    names = list(client.scan_iter(match=f"{keys.prefix()}:*", count=1000))
    if names:
        client.delete(*names)
    deny_cache.clear()  # the refusals of those counters
    policies_changed()
    return len(names)


@contextlib.contextmanager
def temporary_policy(**fields) -> Iterator[Policy]:
    """A validated, saved policy that exists only inside the block (needs database access)."""
    fields.setdefault("name", "temporary-policy")
    policy = Policy(**fields)
    policy.full_clean()
    policy.save()
    try:
        yield policy
    finally:
        policy.delete()
