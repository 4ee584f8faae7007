"""Every Redis key name the app uses, built in one place.

Counters carry the subject hash as a hash tag ({...}) so that all keys of one subject share a
cluster slot; the readable subject never appears in a key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .conf import get_setting

if TYPE_CHECKING:
    from .policies import CompiledPolicy


def prefix() -> str:
    return get_setting("RATELIMIT_KEY_PREFIX")


def counter_key_parts(policy: CompiledPolicy, key_prefix: str | None = None) -> tuple[str, str]:
    """What goes before and after a subject hash in the policy's counter keys."""
    return f"{key_prefix or prefix()}:{{", f"}}:{policy.id}.{policy.generation}:{policy.shape}"


def counter_key(policy: CompiledPolicy, subject_key: str, key_prefix: str | None = None) -> str:
    head, tail = counter_key_parts(policy, key_prefix)
    return head + subject_key + tail


def live_key(policy: CompiledPolicy, key_prefix: str | None = None) -> str:
    return f"{key_prefix or prefix()}:live:{policy.id}.{policy.generation}"


def totals_key(policy: CompiledPolicy, key_prefix: str | None = None) -> str:
    return f"{key_prefix or prefix()}:totals:{policy.id}.{policy.generation}"


def version_key(key_prefix: str | None = None) -> str:
    return f"{key_prefix or prefix()}:version"
