"""Which policies apply: an in-process index of the enabled policies, so a request costs no query.

The index is rebuilt when the policy version in Redis changes. Every decision call returns that
version; when no call carried it for RATELIMIT_POLICY_RECHECK_SECONDS, it is read once on its own.
Whatever happens to the version, the index is also rebuilt every RATELIMIT_POLICY_RELOAD_SECONDS.
Saving or deleting a policy, an override, an action cost or a plan (its limits, its assignments),
or changing a group's members, marks this process's index stale at once and bumps the version on
commit. So does a policy declared in code: the index holds the rows merged with the declarations,
and writes the rows of new ones first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from functools import partial
from typing import Callable, Iterable

from asgiref.sync import sync_to_async
from django.db import DatabaseError, transaction

from . import engine, registry
from .loggate import LogGate
from .engine import RedisUnavailable, bump_version, current_version, read_version
from .conf import get_setting
from .deny_cache import deny_cache
from .loading import compile_policy, read_rows  # noqa: F401  (compile_policy: imported from here by tests, the bench)
from .overrides import PolicyOverrides
from .plans import PlanAssignments, RequestLimits, limits_of
from .values import CompiledPolicy

logger = logging.getLogger("ratelimit_app")


class PolicyIndex:
    """Enabled policies by how they match: everywhere ('*'), by path prefix, by name; and the costs of
    actions (action -> units a request of it takes), matched the same three ways."""

    def __init__(
        self,
        policies: Iterable[CompiledPolicy],
        overrides: dict[int, PolicyOverrides] | None = None,
        costs: dict[str, int] | None = None,
        plans: PlanAssignments | None = None,
    ) -> None:
        self.policies = tuple(policies)
        self.costs = dict(costs or {})
        self.cost_everywhere = self.costs.get("*")
        self.cost_by_prefix = tuple((action, cost) for action, cost in self.costs.items() if action.startswith("/"))
        self.cost_by_name = {
            action: cost for action, cost in self.costs.items() if action != "*" and not action.startswith("/")
        }
        self.overrides = overrides or {}
        self.plans = plans  # who is on which plan; None when no one is
        # an override or a plan may set a request's limit: else every limit is its policy's own
        self.tailored = bool(self.overrides) or plans is not None
        # limits_for(request): what sets this request's limits besides its policies (limit_in_effect reads it),
        # None when nothing does; subjects/matching.py's own, so that the request path does not climb back here
        self.limits_for: Callable[[object], RequestLimits | None] = partial(limits_of, self.overrides, plans)
        self.holds = any(p.holds for p in self.policies)  # a policy counts requests in flight
        self.everywhere = tuple(p for p in self.policies if p.action == "*")
        self.by_prefix = tuple(p for p in self.policies if p.action.startswith("/"))
        by_name: dict[str, list[CompiledPolicy]] = defaultdict(list)
        for policy in self.policies:
            if policy.action != "*" and not policy.action.startswith("/"):
                by_name[policy.action].append(policy)
        self.by_name = {name: tuple(found) for name, found in by_name.items()}
        # whether computing subjects, overrides or plans may read request.user (async views load it first)
        self.needs_user = (
            any(p.counts_users for p in self.policies)
            or any(o.reads_user for o in self.overrides.values())
            or (plans is not None and plans.reads_user)
        )

    def __bool__(self) -> bool:
        return bool(self.policies)  # a cost without a policy charges nothing

    def cost_of(self, *, path: str, names: Iterable[str | None]) -> int | None:
        """The units a request to `path`, known by `names`, takes: the largest cost among the actions it
        meets; None when it meets none (the code's cost, or 1, applies)."""
        if not self.costs:
            return None  # most sites price no action: one attribute read per request
        return max((cost for _action, cost in self.priced_by(path=path, names=names)), default=None)

    def priced_by(self, *, path: str, names: Iterable[str | None]) -> list[tuple[str, int]]:
        """The (action, cost) pairs a request meets, matched like the policies (the tester names them)."""
        found = [(prefix, cost) for prefix, cost in self.cost_by_prefix if path.startswith(prefix)]
        if self.cost_everywhere is not None:
            found.append(("*", self.cost_everywhere))
        by_name = self.cost_by_name
        found += [(name, by_name[name]) for name in dict.fromkeys(names) if name and name in by_name]
        return found

    def matching(self, *, path: str, names: Iterable[str | None] = (), method: str = "GET") -> list[CompiledPolicy]:
        """The policies for a request to `path` with `method`, known by `names` (URL name, scope, action)."""
        # on every request, most often for no policy at all: each kind is skipped when the index has none
        found = [p for p in self.everywhere if p.applies_to_method(method)] if self.everywhere else []
        if self.by_prefix:
            found += [p for p in self.by_prefix if path.startswith(p.action) and p.applies_to_method(method)]
        by_name = self.by_name
        for name in names:
            for policy in by_name.get(name, ()) if name else ():
                if policy.applies_to_method(method) and policy not in found:
                    found.append(policy)
        return found


class _IndexState:
    def __init__(self) -> None:
        self.index: PolicyIndex | None = None
        self.version: bytes | None = None
        self.checked_at = 0.0
        self.loaded_at = 0.0
        # the deadlines the request path compares the clock with, worked out when they move (the
        # settings they come from are read then, not per request)
        self.fresh_until = 0.0  # until then, get_index() returns the index without checking anything
        self.version_due_at = 0.0  # from then on, a decision call brings the version back
        self.stale = True
        # the database could not be read: the policies loaded last stay in force (none: the error is
        # raised again, for the doors' failure rule), and no request reads it again before retry_at
        self.failure: BaseException | None = None
        self.retry_at = 0.0
        self.loaded_wall = 0.0  # when the index in force was loaded, epoch seconds (what workers report)
        self.lock = threading.Lock()

    def checked(self, now: float) -> None:
        """The version was compared (or the index loaded) at `now`."""
        self.checked_at = now
        self.deadlines()

    def deadlines(self) -> None:
        recheck = get_setting("RATELIMIT_POLICY_RECHECK_SECONDS")
        self.version_due_at = self.checked_at + recheck / 2
        reload_at = self.loaded_at + get_setting("RATELIMIT_POLICY_RELOAD_SECONDS")
        self.fresh_until = min(self.checked_at + recheck, reload_at)


_state = _IndexState()
unreadable_said = LogGate()  # the log line saying the database cannot be read, while old policies stay in force


def load_index() -> PolicyIndex:
    """Read the enabled policies, their overrides, the action costs and the plans (loading.read_rows)."""
    return PolicyIndex(*read_rows())


class PoliciesUnreadable(Exception):
    """No policy could be loaded yet: the database did not answer (the doors apply RATELIMIT_FAIL_OPEN)."""


def get_index() -> PolicyIndex:
    """The current index; reloads it when it is stale or the version in Redis moved on. While the
    database cannot be read, the index loaded last stays in force and is read again once a second."""
    index = fresh_index()
    if index is not None:
        return index  # the common case: one clock read, no setting read
    state = _state
    if state.failure is not None and time.monotonic() < state.retry_at:
        if state.index is None:
            raise PoliciesUnreadable(f"the policies cannot be read from the database: {state.failure}")
        return state.index
    if time.monotonic() - state.loaded_at > get_setting("RATELIMIT_POLICY_RELOAD_SECONDS"):
        state.stale = True  # the safety net: whatever happened to the version, reload now and then
    if not state.stale and time.monotonic() - state.checked_at > get_setting("RATELIMIT_POLICY_RECHECK_SECONDS"):
        try:
            observe_version(read_version())
        except RedisUnavailable:
            state.checked(time.monotonic())  # the doors deal with the outage; check again later
    if state.stale or state.index is None:
        _reload()
    return state.index


def fresh_index() -> PolicyIndex | None:
    """The index while nothing needs checking (no call, no database), else None: the async doors
    then await aget_index(), and skip an awaited call on every other request."""
    state = _state
    if time.monotonic() < state.fresh_until and not state.stale:
        return state.index
    return None


async def aget_index() -> PolicyIndex:
    """get_index() for async code: the cached index at once; a reload (database) runs in a thread."""
    index = fresh_index()
    if index is not None:
        return index
    return await sync_to_async(get_index)()


def _reload() -> None:
    state = _state
    with state.lock:
        if not state.stale and state.index is not None:
            return
        if state.failure is not None and time.monotonic() < state.retry_at:
            return  # another thread failed meanwhile
        try:
            _load(state)
        except DatabaseError as error:
            state.failure, state.retry_at = error, time.monotonic() + RETRY_SECONDS
            if state.index is None:
                raise PoliciesUnreadable(f"the policies cannot be read from the database: {error}") from error
            if unreadable_said.due():  # retried every second: said once a minute, not at every retry
                logger.warning("ratelimit: the policies cannot be read from the database (%s); the ones loaded "
                               "%.0f s ago stay in force, read again every %.0f s", error, index_age(), RETRY_SECONDS)
        else:
            state.failure = None


RETRY_SECONDS = 1.0  # between two reads of a database that failed, whatever the traffic


def index_age() -> float | None:
    """Seconds since this process last loaded the policies (None: never), for the live page and status."""
    return None if _state.index is None else time.monotonic() - _state.loaded_at


def load_failure() -> BaseException | None:
    """Why the last load failed, while the policies loaded before stay in force; None when it did not."""
    return _state.failure


def worker_state() -> str:
    """What this worker says of its policies in its heartbeat: when they were loaded, and why the
    database could not be read since (engine.worker_reports() reads every worker's)."""
    state = _state
    if state.index is None:
        return ""
    error = "" if state.failure is None else str(state.failure).replace("\n", " ")[:200]
    return f"{state.loaded_wall:.0f}|{error}"


engine.hooks.worker_state = worker_state


def _load(state: _IndexState) -> None:
    registry.write_pending()  # rows for declarations first seen since the last load, so that it reads them
    state.stale = False  # a change arriving during the load marks it stale again
    try:
        version: bytes | None = current_version()
    except RedisUnavailable:
        version = None
    try:
        state.index = load_index()
    except BaseException:
        state.stale = True  # not loaded: the next read after the retry time loads it
        raise
    if version is not None and version != state.version:
        # a reset or a change announced: refusals from before may no longer hold. With Redis
        # unreachable nothing says so, and its refusals must outlast the outage; a policy whose
        # terms changed in the database meets none of its old refusals anyway (deny_cache._key)
        deny_cache.clear()
    state.version = version
    state.loaded_at, state.loaded_wall = time.monotonic(), time.time()
    state.checked(state.loaded_at)


def version_due() -> bool:
    """Whether the next decision call should bring the version back: at most every half recheck
    interval, so that under traffic the separate read in get_index is never needed."""
    return time.monotonic() > _state.version_due_at


def observe_version(version: bytes | None) -> None:
    """Called with the version each decision call returned (None: not read): a new version means reload."""
    if version is None:
        return
    state = _state
    state.checked(time.monotonic())
    if version != state.version:
        state.stale = True


def policies_changed(using: str = "default") -> None:
    """Mark this process's index stale now and tell the other workers once the change is committed."""
    _state.stale = True
    transaction.on_commit(_publish_change, using=using)


def forget_index() -> None:
    """Load the index again at the next request (tests: the rows it holds may have been rolled back)."""
    _state.stale = True
    _state.index, _state.failure, _state.retry_at = None, None, 0.0  # as a new process: nothing loaded
    unreadable_said.reset()


def forget_settings() -> None:
    """The recheck and reload intervals changed: the deadlines move with them."""
    _state.deadlines()


def _publish_change() -> None:
    _state.stale = True
    bump_version()  # retried in the background until Redis takes it


def _code_changed(using: str | None) -> None:
    """Code declared a policy (None): reload before the next request. Its rows were written (`using`):
    the other workers reload too."""
    if using is None:
        _state.stale = True
    else:
        policies_changed(using)


registry.on_change(_code_changed)
