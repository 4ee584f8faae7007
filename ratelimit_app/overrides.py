"""Per-subject overrides: which limit is in effect for a request, resolved in Python from the index.

Precedence: an exact subject (a user, a single IP address, a header value) before an IP network
(longest prefix first) before a group. An expired override no longer applies, and the next one in
line does. Everything is read from the in-process index: no query, no Redis call.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable

from django.utils import timezone

from .models import MatchKind, Override
from .subjects import client_ip

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class CompiledOverride:
    id: int
    policy_id: int
    kind: str
    exempt: bool
    limit: int | None
    expires_at: datetime | None
    description: str  # what it matches, masked, for the admin and the tester

    def active(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


@dataclass(slots=True)
class PolicyOverrides:
    """The overrides of one policy, arranged for lookup by each kind of matcher."""

    by_user: dict[int, CompiledOverride] = field(default_factory=dict)
    by_address: dict[str, CompiledOverride] = field(default_factory=dict)
    networks: list[tuple[IPNetwork, CompiledOverride]] = field(default_factory=list)
    by_header: dict[tuple[str, str], CompiledOverride] = field(default_factory=dict)
    headers: set[str] = field(default_factory=set)  # META names of the headers some override reads
    by_group: list[tuple[frozenset[int], CompiledOverride]] = field(default_factory=list)

    def add(self, row: Override, members: dict[int, frozenset[int]]) -> None:
        compiled = CompiledOverride(
            row.pk, row.policy_id, row.kind, row.exempt, row.limit, row.expires_at, row.matcher_display()
        )
        if row.kind == MatchKind.USER:
            self.by_user[row.user_id] = compiled
        elif row.kind == MatchKind.GROUP:
            self.by_group.append((members.get(row.group_id, frozenset()), compiled))
        elif row.kind == MatchKind.HEADER:
            meta = header_meta_name(row.header)
            self.headers.add(meta)
            self.by_header[(meta, row.value)] = compiled
        else:
            network = ipaddress.ip_network(row.network, strict=False)
            if network.prefixlen == network.max_prefixlen:
                self.by_address[str(network.network_address)] = compiled
            else:
                self.networks.append((network, compiled))
                self.networks.sort(key=lambda pair: -pair[0].prefixlen)

    def candidates(self, request) -> Iterable[CompiledOverride]:
        """Every override matching the request, most specific first."""
        user = getattr(request, "user", None)
        user_id = user.pk if user is not None and user.is_authenticated else None
        if user_id is not None and user_id in self.by_user:
            yield self.by_user[user_id]
        address = client_ip(request) if (self.by_address or self.networks) else None
        if address in self.by_address:
            yield self.by_address[address]
        meta = request.META
        for name in self.headers:
            found = self.by_header.get((name, meta.get(name, "")))
            if found:
                yield found
        if address and self.networks:
            client = ipaddress.ip_network(address, strict=False)
            for network, override in self.networks:
                if client.version == network.version and client.subnet_of(network):
                    yield override
        if user_id is not None:
            for members, override in self.by_group:
                if user_id in members:
                    yield override


def header_meta_name(header: str) -> str:
    name = header.strip().upper().replace("-", "_")
    return name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{name}"


def compile_overrides(rows: Iterable[Override], members: dict[int, frozenset[int]]) -> dict[int, PolicyOverrides]:
    by_policy: dict[int, PolicyOverrides] = {}
    for row in rows:
        by_policy.setdefault(row.policy_id, PolicyOverrides()).add(row, members)
    return by_policy


def matching_override(overrides: PolicyOverrides | None, request) -> CompiledOverride | None:
    """The override in effect for this request under one policy, or None."""
    if overrides is None:
        return None
    now = timezone.now()
    return next((o for o in overrides.candidates(request) if o.active(now)), None)
