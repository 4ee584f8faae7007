"""Helpers for your own tests: forget counters, install a policy for the length of a block."""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import keys
from .connection import client as redis_client
from .models import Policy
from .policies import policies_changed


def reset_counters() -> int:
    """Delete every key under RATELIMIT_KEY_PREFIX (SCAN is fine here: this is for tests); returns how many."""
    client = redis_client()
    names = list(client.scan_iter(match=f"{keys.prefix()}:*", count=1000))
    if names:
        client.delete(*names)
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
