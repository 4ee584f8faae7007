"""@ratelimit: enforce the policies of an action on a function view, a view method or a View class,
sync or async.

    @ratelimit("login")                      the policies written in the admin for the action 'login'
    @ratelimit(rate="5/m", key="ip")         declares a policy here (action 'code:<module>.<view>'),
                                             shown in the admin as from code, and enforces it
    @ratelimit("search", cost=4)             a request takes 4 units of each policy (or cost=<function
                                             of the request>); a cost the admin gives the action wins
"""

from __future__ import annotations

from functools import partial, wraps
from typing import Any, Callable, Iterable

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.utils.decorators import method_decorator

from . import registry
from .boundary import DECORATOR
from .doors import STATE_ATTRIBUTE, Route, around_view, has_decorator_inside, has_throttle_inside, passed_drf_throttles
from .drivers import Io, arun
from .limiter import Cost, valid_cost
from .rates import format_rate
from .registry import CodePolicy

USAGE = (
    "@ratelimit needs arguments: @ratelimit('login') enforces the policies of the action 'login'; "
    "@ratelimit(rate='5/m', key='ip') declares a policy next to the view."
)
DECLARED_ATTRIBUTE = "_ratelimit_declared"  # the names of the policies declared on a view, outermost last
_made = tuple.__new__  # Io(...) runs the named tuple's Python __new__ (its defaults) on every request


def ratelimit(
    action: str | None = None,
    *,
    rate: str | tuple[int, int] | None = None,
    key: str = "ip",
    method: str | Iterable[str] | None = None,
    mode: str | None = None,
    strategy: str | None = None,
    name: str | None = None,
    burst: int | None = None,
    limit: int | None = None,
    window: int | None = None,
    cost: Cost | None = None,
    time_zone: str | None = None,
    unit: str | None = None,
    overage_cap: int | None = None,
) -> Callable:
    """Enforce the policies of `action`, or declare one (`rate=` or `limit=` + `window=`) and enforce it.
    `cost`: the units a request takes from each of them (a number, or a function of the request); with a
    `unit` ('tokens', 'content-bytes'), the estimate a request is admitted on before it settles."""
    if callable(action):
        raise TypeError(USAGE)  # bare @ratelimit: fail at import, not at the first request
    if cost is not None and not callable(cost) and valid_cost(cost, "@ratelimit(cost=...)") != cost:
        raise ImproperlyConfigured(f"@ratelimit(cost={cost}): a request costs at least 1 unit.")
    declaring = rate is not None or limit is not None or window is not None
    if action is not None and (unit is not None or overage_cap is not None):
        raise TypeError("@ratelimit(unit=...) declares a policy's unit: give it with a rate, not with an action.")
    if action is not None and declaring:
        raise TypeError("@ratelimit takes either an action ('login') or a rate (rate='5/m', key='ip'), not both.")
    if action is None and not declaring:
        raise TypeError(USAGE)
    if action is not None:
        registry.note_cost(action, cost)
        return partial(_decorate, action=action, declared=None, cost=cost)
    options = {"rate": rate, "limit": limit, "window": window, "key": key, "methods": method, "burst": burst}
    given = (("mode", mode), ("strategy", strategy), ("time_zone", time_zone), ("unit", unit),
             ("overage_cap", overage_cap))
    options.update((field, value) for field, value in given if value is not None)

    def declare(view):
        policy = _declare(view, name, options)
        registry.note_cost(policy.values["action"], cost, policy)
        return _decorate(view, action=policy.values["action"], declared=policy, cost=cost)

    return declare


def _declare(view, name: str | None, options: dict[str, Any]) -> CodePolicy:
    """Each declaration is a policy of its own, enforced where it is written: the first on a view keeps
    the view's name and action; another one (stacked, or the view routed again with another rate) gets
    a name and an action of its own, so that neither applies to the other's route. The same
    declaration written twice is one policy (one count), as django-ratelimit counts one group."""
    path = registry.view_path(view)
    origin = f"@ratelimit on {path}"
    earlier = registry.declarations_of(path)
    if not earlier:
        policy = registry.code_policy(name or registry.slug_name(path), action=f"code:{path}", origin=origin, **options)
        return registry.declared_on(path, registry.register_policy(policy))
    terms = _terms(registry.code_policy("declared", action=f"code:{path}", origin=origin, **options))  # validated
    for known in earlier:
        if (name is None or known.name == name) and _terms(known) == terms:
            return known  # written twice (two routes, or stacked): one policy
    if name is None:
        rate = format_rate(terms["limit"], terms["window"])
        free = [
            candidate for candidate in (f"{path}-{terms['key']}", f"{path}-{rate}-{terms['key']}-{terms['methods']}")
            if all(known.name != registry.slug_name(candidate) for known in earlier)
        ]
        if not free:
            raise ImproperlyConfigured(f"{origin}: several policies declared here need name='...' each.")
        name = registry.slug_name(free[0])
    elif any(known.name == name for known in earlier):
        raise ImproperlyConfigured(
            f"{origin}: the policy {name!r} is declared here twice with different values; give each its own name.")
    policy = registry.code_policy(name, action=f"code:{path}@{name}", origin=origin, **options)
    return registry.declared_on(path, registry.register_policy(policy))


def _terms(policy: CodePolicy) -> dict[str, Any]:
    """What a declaration enforces, apart from where (its action)."""
    return {field: value for field, value in policy.values.items() if field != "action"}


def _decorate(view, *, action: str, declared: CodePolicy | None, cost: Cost | None, is_async: bool | None = None):
    if isinstance(view, type):  # a class-based view: decorate its dispatch (which returns a coroutine when async)
        decorate = partial(_decorate, action=action, declared=declared, cost=cost, is_async=view.view_is_async)
        return _remember(method_decorator(decorate, name="dispatch")(view), declared)
    decorator_inside = has_decorator_inside(view)
    throttle_inside = not decorator_inside and has_throttle_inside(view)

    names = (action,)
    # the request's one door (no other made its state): its policies and checks are kept by route, as the
    # middleware's are; an outer door leaves the names it gathered to the matching of the door inside
    alone = Route(names, False, False, False)
    always_last = not decorator_inside and not throttle_inside

    def last(request) -> bool:
        return not decorator_inside and (not throttle_inside or passed_drf_throttles(request))

    # the two bodies are the same but for the await, written out: no call more on every request
    if iscoroutinefunction(view) if is_async is None else is_async:
        async def limited(request, *args, **kwargs):  # a coroutine function to inspect too, as the view was
            if declared is not None:
                _declared_again(declared)
            is_last = always_last or last(request)
            first = STATE_ATTRIBUTE not in request.__dict__.get("_request", request).__dict__
            steps = around_view(request, _made(Io, (view, view, (request, *args), kwargs)), DECORATOR, names,
                                last=is_last, cost=cost, route=alone if is_last and first else None)
            return await arun(steps)
    else:
        def limited(request, *args, **kwargs):
            if declared is not None:
                _declared_again(declared)
            is_last = always_last or last(request)
            first = STATE_ATTRIBUTE not in request.__dict__.get("_request", request).__dict__
            return around_view.sync(request, _made(Io, (view, view, (request, *args), kwargs)), DECORATOR, names,
                                    last=is_last, cost=cost, route=alone if is_last and first else None)
    limited = wraps(view)(limited)
    limited.ratelimit_actions = (*getattr(view, "ratelimit_actions", ()), action)
    if cost is not None:
        limited.ratelimit_cost = cost  # the policy tester shows it
    return _remember(limited, declared)


def _declared_again(declared: CodePolicy) -> None:
    # a reset (tests) forgets a view's declaration until a URLconf routes to it: a view called directly
    # declares it again (a dict lookup when it is still declared)
    registry.register_policy(declared)


def _remember(view, declared: CodePolicy | None):
    if declared is not None:
        setattr(view, DECLARED_ATTRIBUTE, (*getattr(view, DECLARED_ATTRIBUTE, ()), declared.name))
    return view
