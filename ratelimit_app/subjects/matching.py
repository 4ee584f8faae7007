"""Which row matching a request's subject applies to it: overrides and plan assignments, arranged by one
SubjectMatcher, and the limit in effect that follows (overrides.py and plans.py compile them from the rows).

Precedence, the narrowest subject first: a header value (an API key), a user, an IP address, an IP network
(longest prefix first), a group; between equals, the older row (created first, then lower id), in every
process. An expired row no longer applies, and the next one in line does. Everything is read from the
in-process index: no query, no Redis call. Beside the key specs (the same unit on a request's way), so that
a request on a plan or with an override is resolved where its subject is.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Generic, Iterator, NamedTuple, Protocol, TypeVar

from django.utils import timezone

from .addresses import client_address, ip_network
from .reading import header_value, meta_key

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Expiring(Protocol):
    def active(self, now: datetime) -> bool: ...


Item = TypeVar("Item", bound=Expiring)


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
class SubjectMatcher(Generic[Item]):
    """Compiled rows that match requests (each carried as an `Item`), arranged for lookup by each kind.

    Rows are added oldest first (by creation, then pk, as the loader reads them). Several rows may match the same
    user, address or header value (one expired, one active): all are kept, and the first active one applies.
    """

    by_user: dict[int, list[Item]] = field(default_factory=dict)
    by_address: dict[str, list[Item]] = field(default_factory=dict)
    networks: list[tuple[IPNetwork, Item]] = field(default_factory=list)
    by_header: dict[tuple[str, str], list[tuple[int, Item]]] = field(default_factory=dict)  # (age rank, item)
    headers: dict[str, None] = field(default_factory=dict)  # META names some row reads, in row order
    by_group: list[tuple[frozenset[int], Item]] = field(default_factory=list)
    added: int = 0

    def add(self, row, item: Item, members: dict[int, frozenset[int]]) -> None:
        """Match the requests `row` (a models.SubjectMatch) describes with `item`; `members`: group id -> its
        users' ids. Its kind is compared by value (models.MatchKind's), the models being above this module."""
        self.added += 1
        if row.kind == "user":
            self.by_user.setdefault(row.user_id, []).append(item)
        elif row.kind == "group":
            self.by_group.append((members.get(row.group_id, frozenset()), item))
        elif row.kind == "header":
            meta = meta_key(row.header)
            self.headers[meta] = None
            self.by_header.setdefault((meta, row.value), []).append((self.added, item))
        else:
            network = ip_network(row.network)  # as client addresses are matched: rows saved mapped match too
            if network.prefixlen == network.max_prefixlen:
                self.by_address.setdefault(str(network.network_address), []).append(item)
            else:
                self.networks.append((network, item))
                self.networks.sort(key=lambda pair: -pair[0].prefixlen)  # stable: same prefix keeps row order

    @property
    def reads_user(self) -> bool:
        return bool(self.by_user or self.by_group)

    def candidates(self, request) -> Iterator[Item]:
        """Every item matching the request, the narrowest subject first (see the module's docstring).

        Addresses are matched on the client's own address, not on the group a policy counts
        (RATELIMIT_IPV6_PREFIX, RATELIMIT_IPV4_PREFIX): an override for one client is that client's.
        """
        if self.headers:
            meta = request.META
            found = [pair for name in self.headers for pair in self.by_header.get((name, header_value(meta, name)), ())]
            # rows of several header names matching one request: the older row first, whatever its name
            yield from (item for _, item in (sorted(found, key=itemgetter(0)) if len(found) > 1 else found))
        user = getattr(request, "user", None)
        user_id = user.pk if user is not None and user.is_authenticated else None
        if user_id is not None:
            yield from self.by_user.get(user_id, ())
        address = client_address(request) if (self.by_address or self.networks) else None
        if address is not None:
            yield from self.by_address.get(str(address), ())
        if address is not None and self.networks:
            for network, item in self.networks:
                if address.version == network.version and address in network:
                    yield item
        if user_id is not None:
            for members, item in self.by_group:
                if user_id in members:
                    yield item

    def first_active(self, request) -> Item | None:
        """The first item matching the request, by precedence, that has not expired, or None."""
        now = timezone.now()
        return next((item for item in self.candidates(request) if item.active(now)), None)


PolicyOverrides = SubjectMatcher[CompiledOverride]  # the overrides of one policy


@dataclass(frozen=True, slots=True)
class CompiledPlan:
    id: int
    name: str
    limits: dict[int, int | None]  # policy id -> the plan's limit there (None: exempt)

    def __hash__(self) -> int:
        return self.id


@dataclass(frozen=True, slots=True)
class CompiledAssignment:
    id: int
    plan: CompiledPlan
    expires_at: datetime | None
    description: str  # what it matches, masked, for the admin and the tester

    def active(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


PlanAssignments = SubjectMatcher[CompiledAssignment]


def matching_override(overrides: PolicyOverrides | None, request) -> CompiledOverride | None:
    """The override in effect for this request under one policy, or None."""
    return None if overrides is None else overrides.first_active(request)


def assignment_of(assignments: PlanAssignments | None, request) -> CompiledAssignment | None:
    """The assignment that puts this request on a plan (the first in effect, by precedence), or None."""
    return None if assignments is None else assignments.first_active(request)


def plan_of(assignments: PlanAssignments | None, request) -> CompiledPlan | None:
    """The plan this request is on, or None."""
    found = assignment_of(assignments, request)
    return None if found is None else found.plan


class InEffect(NamedTuple):
    """The limit under one policy for one request, and what set it."""

    limit: int | None  # None: exempt
    plan: str  # the plan that set it, '' when none did
    override: CompiledOverride | None  # the override that set it, None when none did


class RequestLimits:
    """What sets one request's limits besides its policies: its plan, and the overrides of each policy.
    Made once a request (limits_of, the index's limits_for); `of` then answers for each of its policies."""

    __slots__ = ("request", "overrides", "plan")

    def __init__(self, request, overrides: dict[int, PolicyOverrides], plan: CompiledPlan | None) -> None:
        self.request = request
        self.overrides = overrides
        self.plan = plan

    def of(self, policy_id: int, limit: int) -> InEffect:
        """The limit under a policy whose own is `limit`: the subject's override first, then its plan's
        limit for that policy, then the policy's."""
        override = matching_override(self.overrides.get(policy_id), self.request)
        if override is not None:
            return InEffect(None if override.exempt else override.limit, "", override)
        plan = self.plan
        if plan is not None and policy_id in plan.limits:
            return InEffect(plan.limits[policy_id], plan.name, None)
        return InEffect(limit, "", None)


def limits_of(overrides: dict[int, PolicyOverrides], plans: PlanAssignments | None, request) -> RequestLimits | None:
    """What sets this request's limits besides its policies, under these `overrides` (policy id -> its own)
    and `plans`; None when nothing does: no override anywhere, and the request is on no plan."""
    if not overrides and plans is None:
        return None
    plan = plan_of(plans, request)
    return RequestLimits(request, overrides, plan) if overrides or plan is not None else None


def limit_in_effect(limits: RequestLimits | None, policy_id: int, limit: int) -> InEffect:
    """The limit under a policy whose own is `limit`, for a request whose `limits` are these (None:
    nothing but its policies sets them). The one place that says it (plans.py re-exports it)."""
    return InEffect(limit, "", None) if limits is None else limits.of(policy_id, limit)
