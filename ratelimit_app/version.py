"""The policy version counter in Redis: bumped when policies change, compared by every worker."""

from __future__ import annotations

from . import keys
from .connection import breaker, client


def read_version() -> int:
    return int(breaker.call(lambda: client().get(keys.version_key())) or 0)


def bump_version() -> int:
    """Tell every worker that policies changed; they reload within RATELIMIT_POLICY_RECHECK_SECONDS."""
    return breaker.call(lambda: client().incr(keys.version_key()))
