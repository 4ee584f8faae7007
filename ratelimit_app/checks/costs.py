"""System check of the costs code sets (E018): a cost no enforcing policy of its action can admit, or
one that is not a whole number of units."""

from __future__ import annotations

from typing import Iterator, Sequence

from django.core.checks import Error, Tags, register
from django.urls import URLPattern, URLResolver, get_resolver

from ..models import Policy
from .rows import readable_policies


@register()
def check_code_costs(app_configs: object = None, **kwargs: object) -> list:
    """A fixed cost in code that cannot be used: not a whole number of at least 1 (a DRF view's
    `throttle_cost`), or above what an enforcing policy declared in code allows at once."""
    return _code_cost_errors(None)


@register(Tags.database)
def check_code_costs_against_rows(app_configs: object = None, databases: Sequence[str] | None = None,
                                  **kwargs: object) -> list:
    """The same against the policies' rows, with `--database` (and during migrate), once their table exists.
    Tagged: Django 6 hands every check the databases, and only a database check may read them."""
    by_code = _code_cost_errors(None)
    return [error for database in databases or () for error in _code_cost_errors(database) if error not in by_code]


def _code_cost_errors(database: str | None) -> list:
    from .. import registry

    errors = [
        Error(f"{where} = {cost!r}: {problem}; a cost is a whole number of units, at least 1.",
              hint="Write e.g. throttle_cost = 3, or compute it per request in get_throttle_cost(self, request).",
              id="ratelimit_app.E018")
        for where, cost, problem in _unusable_view_costs()
    ]
    capacities = _enforcing_capacities(database)
    costs = _view_costs()
    for action, (cost, origin) in registry.code_costs().items():
        if action not in costs or costs[action][0] < cost:
            costs[action] = (cost, origin)
    for action, (cost, origin) in sorted(costs.items()):
        for name, allowed in capacities.get(action, ()):
            if cost > allowed:
                errors.append(Error(
                    f"{origin}: a request of {action!r} costs {cost} units, more than policy {name!r} "
                    f"allows at once ({allowed}): it could never be admitted.",
                    hint="Lower the cost, or raise the policy's limit (or burst).",
                    id="ratelimit_app.E018",
                ))
    return errors


def _enforcing_capacities(database: str | None) -> dict[str, list[tuple[str, int]]]:
    """action -> (policy name, what it admits at once) of the enabled, enforcing policies: the rows of
    `database` when it can be read, else (and for a declaration without its row) the code's values."""
    from .. import registry
    from ..models import Mode

    # a limit computed per request (create_only) is not known here
    found = {p.name: Policy(**p.values, name=p.name) for p in registry.declared_policies() if not p.create_only}
    rows = readable_policies(database) if database else None
    found.update((row.name, row) for row in rows or ())
    capacities: dict[str, list[tuple[str, int]]] = {}
    for name, row in sorted(found.items()):
        if row.enabled and row.mode == Mode.ENFORCE:
            capacities.setdefault(row.action, []).append((name, row.capacity()[0]))
    return capacities


def _routed_views(patterns, prefix: str = "") -> Iterator[tuple[object, str | None]]:
    """(view, URL name with its namespaces) of every route of the URLconf."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            namespace = f"{prefix}{pattern.namespace}:" if pattern.namespace else prefix
            yield from _routed_views(pattern.url_patterns, namespace)
        elif isinstance(pattern, URLPattern):
            yield pattern.callback, f"{prefix}{pattern.name}" if pattern.name else None


def _drf_views() -> Iterator[tuple[type, str | None]]:
    """The DRF views of the URLconf that a PolicyThrottle runs, with their URL names."""
    from ..doors import is_policy_throttled

    try:
        patterns = get_resolver().url_patterns
    except Exception:  # noqa: BLE001 - Django's own check of the URLconf reports why it does not load
        return
    for view, url_name in _routed_views(patterns):
        view_class = getattr(view, "cls", None)
        if view_class is not None and is_policy_throttled(view_class):
            yield view_class, url_name


def _fixed_view_cost(view_class: type) -> object:
    """A DRF view's fixed `throttle_cost` (None: it sets none, or computes it per request)."""
    if callable(getattr(view_class, "get_throttle_cost", None)):
        return None
    return getattr(view_class, "throttle_cost", None)


def _unusable_view_costs() -> list[tuple[str, object, str]]:
    from ..registry import fixed_cost_problem

    found = []
    for view_class, _url_name in _drf_views():
        cost = _fixed_view_cost(view_class)
        problem = None if cost is None else fixed_cost_problem(cost)
        if problem:
            found.append((f"{view_class.__module__}.{view_class.__qualname__}.throttle_cost", cost, problem))
    return sorted(set(found), key=lambda item: item[0])


def _view_costs() -> dict[str, tuple[int, str]]:
    """action -> (the largest usable fixed cost DRF views give it, where): by throttle_scope and URL name."""
    from ..registry import fixed_cost_problem

    costs: dict[str, tuple[int, str]] = {}
    for view_class, url_name in _drf_views():
        cost = _fixed_view_cost(view_class)
        if cost is None or fixed_cost_problem(cost):
            continue
        where = f"{view_class.__module__}.{view_class.__qualname__}.throttle_cost"
        for action in (getattr(view_class, "throttle_scope", None), url_name):
            if action and (action not in costs or costs[action][0] < cost):
                costs[action] = (cost, where)
    return costs
