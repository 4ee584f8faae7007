"""Helpers for your own tests: forget what the app keeps in a process, forget counters, install a
policy for the length of a block."""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import runtime
from .engine import client as redis_client
from .engine import key_prefix
from .deny_cache import deny_cache
from .models import Policy
from .policies import policies_changed


def reset() -> None:
    """Forget everything ratelimit_app keeps in this process, as if it had just started: the policy
    index (loaded again at the next request), the policies views declared (declared again for the
    views of the URLconf in use, and their rows written again), refusals kept in memory, the circuit
    breaker and what the logs already said, in-flight places and counts not yet sent to Redis, quota
    usage not saved yet, the Redis clients and kept connections, and whatever was read from the
    settings. Redis and the database are left as they are (see reset_counters()).

    Call it between tests that roll the database back or empty Redis, e.g. in an autouse fixture.
    """
    runtime.state.reset()


def reset_counters() -> int:
    """Delete every key under RATELIMIT_KEY_PREFIX (SCAN is fine here: this is for tests); returns how many."""
    client = redis_client()
    names = list(client.scan_iter(match=f"{key_prefix()}:*", count=1000))
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
