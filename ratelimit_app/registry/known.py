"""The declarations this process knows: made by views' decorators, compat classes and declare_policy(),
or read from settings by providers at each load; with what the policy index is told when they change."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from django.core.exceptions import ImproperlyConfigured

from .declarations import CodePolicy, capacity, code_policy, settings_policies

logger = logging.getLogger("ratelimit_app")


RETRY_SECONDS = 1.0  # between two writes of declared rows that the database refused


class _Registry:
    def __init__(self) -> None:
        self.declared: dict[str, CodePolicy] = {}
        # functions returning declarations read from settings at each load (so override_settings works)
        self.providers: list[Callable[[], list[CodePolicy]]] = [settings_policies]
        self.written: set[str] = set()  # names whose rows hold their current declaration (written or found)
        self.pending = True  # some declaration may have no row yet (startup, a new declaration, new settings)
        self.retry_at = 0.0  # writing failed: not tried again before then (monotonic), whatever the traffic
        # the URLconf in use is read before declarations are (its views declare first), at a process's
        # first request or after a reset or a new ROOT_URLCONF
        self.routes_pending = True
        # action -> the largest fixed cost a view's code gives it, and where
        self.costs: dict[str, tuple[int, str]] = {}
        # the decorator's declarations per view, in order: kept after a reset, to be made again when a
        # URLconf routes to the view (its module is imported once, its decorators never run again)
        self.by_view: dict[str, list[CodePolicy]] = {}
        # told when declarations change (None) or rows were written (the database alias): the policy index
        self.listeners: list[Callable[[str | None], None]] = []
        self.lock = threading.Lock()


_registry = _Registry()


def on_change(listener: Callable[[str | None], None]) -> None:
    """Call `listener(None)` when a declaration is added or changed, `listener(using)` when rows were written."""
    if listener not in _registry.listeners:
        _registry.listeners.append(listener)


def changed(using: str | None) -> None:
    """Tell the listeners: declarations changed (None), or rows were written to the database `using`."""
    for listener in list(_registry.listeners):
        listener(using)


def declare_policy(name: str, **fields: Any) -> CodePolicy:
    """Validate a declaration (no database access) and add it to the registry; returns it.

    Takes the arguments of code_policy(); raises ImproperlyConfigured, naming the origin, when a value is wrong.
    """
    return register_policy(code_policy(name, **fields))


def register_policy(policy: CodePolicy) -> CodePolicy:
    """Add or replace a declaration (a module imported again, a compat class with a new rate)."""
    if _registry.declared.get(policy.name) is policy:
        return policy  # the compat doors declare on every request: no lock for the usual case
    with _registry.lock:
        known = _registry.declared.get(policy.name)
        if known == policy:
            return known
        _registry.declared[policy.name] = policy
        _registry.written.discard(policy.name)
        _registry.pending = True
    changed(None)  # the index enforces it from the next request on, with or without its row
    return policy


def view_path(view: Any) -> str:
    """The dotted path that names a view's declarations: a class-based view's class, or the function."""
    owner = getattr(view, "view_class", None) or getattr(view, "cls", None) or view  # View.as_view(): the class
    return f"{owner.__module__}.{owner.__qualname__}"


def declarations_of(view: str) -> list[CodePolicy]:
    """What the decorator declared on the view of dotted path `view` so far (still declared)."""
    return [policy for policy in _registry.by_view.get(view, ()) if _registry.declared.get(policy.name) is policy]


def declared_on(view: str, policy: CodePolicy) -> CodePolicy:
    """Remember that the decorator declared `policy` on `view` (so that another declaration there differs)."""
    _registry.by_view.setdefault(view, []).append(policy)
    return policy


def note_cost(action: str, cost: Any, declared: CodePolicy | None = None) -> None:
    """Remember a fixed cost a view's code gives `action` (for the checks and the admin's form); a
    cost above the capacity of the policy declared with it can never fit: ImproperlyConfigured."""
    if cost is None or callable(cost):
        return  # computed per request: a cost that never fits is answered then
    if declared is not None and cost > capacity(declared.values):
        raise ImproperlyConfigured(
            f"{declared.origin}: a request costs {cost} units, more than the policy allows at once "
            f"({capacity(declared.values)}): it could never be admitted."
        )
    known = _registry.costs.get(action)
    if known is None or known[0] < cost:
        _registry.costs[action] = (cost, declared.origin if declared else f"@ratelimit({action!r}, cost={cost})")


def code_costs() -> dict[str, tuple[int, str]]:
    """The fixed costs views' code gives actions: action -> (the largest, where it is declared)."""
    return dict(_registry.costs)


def add_provider(provider: Callable[[], list[CodePolicy]]) -> None:
    """Declarations that depend on settings (RATELIMIT_POLICIES, DRF's DEFAULT_THROTTLE_RATES), read at each sync."""
    if provider not in _registry.providers:
        _registry.providers.append(provider)


def declared_policies() -> list[CodePolicy]:
    """Everything declared in code: the views of the URLconf in use and decorators imported so far,
    compat classes, declare_policy()'s, and the providers'."""
    declare_routes()
    found = dict(_registry.declared)
    for provider in _registry.providers:
        for policy in provider():
            found.setdefault(policy.name, policy)
    return list(found.values())


def declared(name: str) -> CodePolicy | None:
    return next((policy for policy in declared_policies() if policy.name == name), None)


def declared_names() -> set[str]:
    return {policy.name for policy in declared_policies()}


# --- the URLconf's views ------------------------------------------------------------------------


def declare_routes() -> None:
    """Once per process (again after a reset or a new ROOT_URLCONF): import the URLconf in use and
    declare again what its views declared (forgotten by a reset)."""
    if not _registry.routes_pending:
        return
    from django.urls import get_resolver

    _registry.routes_pending = False  # first: a view's module imported now reads the declarations
    try:
        views = list(_views(get_resolver().url_patterns))
    except Exception:  # noqa: BLE001 - the request's own resolve raises it again, where Django reports it
        logger.debug("ratelimit: the URLconf did not import before the first request", exc_info=True)
        return
    for view in views:
        for policy in list(_registry.by_view.get(view_path(view), ())):
            register_policy(policy)


def _views(patterns: Iterable[Any]) -> Iterator[Any]:
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):  # an include()
            yield from _views(pattern.url_patterns)
        else:
            yield pattern.callback


def forget_routes() -> None:
    """Another URLconf is in use: what its views declared is declared again before the next load."""
    _registry.routes_pending = True
    changed(None)


# --- which declarations have their rows ------------------------------------------------------------


def take_pending() -> set[str] | None:
    """The names whose rows are written, if some declaration may have none (None: all have theirs).
    Clears the flag: a declaration made meanwhile sets it again."""
    if not _registry.pending or _registry.retry_at and time.monotonic() < _registry.retry_at:
        return None
    with _registry.lock:
        _registry.pending = False
        return set(_registry.written)


def mark_written(policies: Iterable[CodePolicy]) -> None:
    """These declarations have their rows (unless replaced by another declaration meanwhile)."""
    with _registry.lock:
        _registry.written.update(p.name for p in policies if _registry.declared.get(p.name, p) is p)


def retry_later() -> None:
    """Writing failed: try again before a load RETRY_SECONDS from now (not at every request meanwhile)."""
    with _registry.lock:
        _registry.pending = True
        _registry.retry_at = time.monotonic() + RETRY_SECONDS


def not_written(policies: Iterable[CodePolicy]) -> None:
    """Declarations the index found no row for (a rolled-back transaction, a deleted row): written again
    before the next load."""
    with _registry.lock:
        _registry.written.difference_update(policy.name for policy in policies)
        _registry.pending = True


def forget_synced() -> None:
    """Write every declaration again before the next load (the settings that providers read changed, or a
    test's database was rolled back)."""
    with _registry.lock:
        _registry.written.clear()
        _registry.pending = True
    changed(None)


def forget_declarations() -> None:
    """Forget what views declared (declared again when the URLconf in use routes to them) and which rows
    were written (written again): a test's declarations and a rolled-back database do not outlive it.
    Declarations not made on a view (compat classes, declare_policy()) and the settings' stay."""
    with _registry.lock:
        for made in _registry.by_view.values():
            for policy in made:
                if _registry.declared.get(policy.name) is policy:
                    del _registry.declared[policy.name]
        _registry.written.clear()
        _registry.pending = True
        _registry.retry_at = 0.0
        _registry.routes_pending = True
    changed(None)


def declarations() -> dict[str, CodePolicy]:
    """What is declared now, for restore_declarations() (tests: before each test)."""
    with _registry.lock:
        return dict(_registry.declared)


def restore_declarations(kept: dict[str, CodePolicy]) -> None:
    """Declare exactly `kept` again (tests: after each test). A compat class defined or used by a test, or a
    declare_policy() it called, would otherwise be written into every later test's database; each
    declares again when used (a compat door at every request, a view when a URLconf routes to it)."""
    with _registry.lock:
        if _registry.declared == kept:
            return
        _registry.declared = dict(kept)
        _registry.written.clear()
        _registry.pending = True
    changed(None)


def undeclare(name: str) -> None:
    """Forget one declaration (tests: a policy a test declared does not outlive it)."""
    with _registry.lock:
        _registry.declared.pop(name, None)
        _registry.written.discard(name)
    changed(None)
