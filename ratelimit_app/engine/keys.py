"""Every Redis key name the app uses, built in one place.

Subjects are spread over RATELIMIT_SHARDS shards; every key of one shard carries the shard as its
hash tag ({7}), so a subject's counters and the live index and totals they feed share a cluster slot.
With one shard (a single server) the keys are those of earlier versions: a counter's tag is its
subject hash, unused by a single server, and the live index and totals have none. The readable
subject never appears in a key.
"""

from __future__ import annotations

import base64
import zlib
from typing import TYPE_CHECKING

from ..conf import get_setting

if TYPE_CHECKING:
    from ..values import CompiledPolicy


def prefix() -> str:
    return get_setting("RATELIMIT_KEY_PREFIX")


def shards() -> int:
    return get_setting("RATELIMIT_SHARDS")


def shard_of(subject_key: str) -> int:
    """The shard of a subject: its hash (hex digits) modulo RATELIMIT_SHARDS, the same in every process."""
    count = shards()
    if count == 1:  # a single server: asked for every policy of every request
        return 0
    try:
        return int(subject_key, 16) % count
    except ValueError:  # a subject key that is not a hash (a custom Subject): any stable spread will do
        return zlib.crc32(subject_key.encode()) % count


def _tag(shard: int) -> str:
    """The shard's hash tag in the live index and totals keys ('' with one shard)."""
    return f"{{{shard}}}:" if shards() > 1 else ""


def counter_key_parts(policy: CompiledPolicy, shard: int, key_prefix: str | None = None) -> tuple[str, str]:
    """What goes before and after a subject hash in the counter keys of the policy's subjects in `shard`."""
    tail = f"{policy.id}.{policy.generation}:{policy.shape}"
    if shards() == 1:  # one byte shorter than a shard tag: a counter stays within Redis' 72-byte allocation
        return f"{key_prefix or prefix()}:{{", f"}}:{tail}"
    return f"{key_prefix or prefix()}:{{{shard}}}:", f":{tail}"


def subject_part(subject_key: str) -> str:
    """A subject hash as a counter key carries it: its 8 bytes in base64url (11 characters rather than 16
    hex digits), so that a counter's key stays under 30 characters and its value within Redis' 72-byte
    allocation; a custom subject key as it is."""
    try:
        return base64.urlsafe_b64encode(bytes.fromhex(subject_key)).rstrip(b"=").decode()
    except ValueError:
        return subject_key


def counter_key(policy: CompiledPolicy, subject_key: str, key_prefix: str | None = None) -> str:
    head, tail = counter_key_parts(policy, shard_of(subject_key), key_prefix)
    return head + subject_part(subject_key) + tail


def workers_key(key_prefix: str | None = None) -> str:
    """A hash of what each worker last said of its policies: 'host:pid' -> 'said_at|loaded_at|error'."""
    return f"{key_prefix or prefix()}:workers"


def live_key(policy: CompiledPolicy, shard: int, key_prefix: str | None = None) -> str:
    """The live index of the policy's subjects in `shard` (recently active subjects, bounded)."""
    return f"{key_prefix or prefix()}:live:{_tag(shard)}{policy.id}.{policy.generation}"


def totals_key(policy: CompiledPolicy, shard: int, key_prefix: str | None = None) -> str:
    """Requests allowed and denied for the policy's subjects in `shard` (activity.lua)."""
    return f"{key_prefix or prefix()}:totals:{_tag(shard)}{policy.id}.{policy.generation}"


def version_key(key_prefix: str | None = None) -> str:
    return f"{key_prefix or prefix()}:version"
