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

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.utils.decorators import method_decorator

from . import headers, registry
from .doors import (
    adecide_left_over,
    ainner_door,
    afinish,
    alet_go,
    decide_left_over,
    finish,
    has_decorator_inside,
    has_throttle_inside,
    inner_door,
    let_go,
    passed_drf_throttles,
)
from .limiter import Cost, valid_cost
from .registry import CodePolicy
from .responses import refusal

USAGE = (
    "@ratelimit needs arguments: @ratelimit('login') enforces the policies of the action 'login'; "
    "@ratelimit(rate='5/m', key='ip') declares a policy next to the view."
)
DECLARED_ATTRIBUTE = "_ratelimit_declared"  # names declared on a view, so stacked declarations differ


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
) -> Callable:
    """Enforce the policies of `action`, or declare one (`rate=` or `limit=` + `window=`) and enforce it.
    `cost`: the units a request takes from each of them (a number, or a function of the request)."""
    if callable(action):
        raise TypeError(USAGE)  # bare @ratelimit: fail at import, not at the first request
    if cost is not None and not callable(cost) and valid_cost(cost, "@ratelimit(cost=...)") != cost:
        raise ImproperlyConfigured(f"@ratelimit(cost={cost}): a request costs at least 1 unit.")
    declaring = rate is not None or limit is not None or window is not None
    if action is not None and declaring:
        raise TypeError("@ratelimit takes either an action ('login') or a rate (rate='5/m', key='ip'), not both.")
    if action is None and not declaring:
        raise TypeError(USAGE)
    if action is not None:
        registry.note_cost(action, cost)
        return partial(_decorate, action=action, declared=None, cost=cost)
    options = {"rate": rate, "limit": limit, "window": window, "key": key, "methods": method, "burst": burst}
    options.update((field, value) for field, value in (("mode", mode), ("strategy", strategy)) if value is not None)

    def declare(view):
        policy = _declare(view, name, options)
        registry.note_cost(policy.values["action"], cost, policy)
        return _decorate(view, action=policy.values["action"], declared=policy, cost=cost)

    return declare


def _declare(view, name: str | None, options: dict[str, Any]) -> CodePolicy:
    path = f"{view.__module__}.{view.__qualname__}"
    taken = getattr(view, DECLARED_ATTRIBUTE, ())
    if name is None:
        name = registry.slug_name(path)
        if name in taken:  # a second policy stacked on the same view
            name = registry.slug_name(f"{path}-{options['key']}")
        if name in taken:
            raise ImproperlyConfigured(f"@ratelimit on {path}: several policies stacked here need name='...' each.")
    return registry.declare_policy(name, action=f"code:{path}", origin=f"@ratelimit on {path}", **options)


def _decorate(view, *, action: str, declared: CodePolicy | None, cost: Cost | None, is_async: bool | None = None):
    if isinstance(view, type):  # a class-based view: decorate its dispatch (which returns a coroutine when async)
        decorate = partial(_decorate, action=action, declared=declared, cost=cost, is_async=view.view_is_async)
        return _remember(method_decorator(decorate, name="dispatch")(view), declared)
    decorator_inside = has_decorator_inside(view)
    throttle_inside = not decorator_inside and has_throttle_inside(view)
    if is_async is None:
        is_async = iscoroutinefunction(view)

    if is_async:

        @wraps(view)
        async def limited(request, *args, **kwargs):
            if declared is not None and not registry.is_synced(declared):
                await sync_to_async(registry.ensure_synced)(declared)  # a view module imported late
            last = not decorator_inside and (not throttle_inside or passed_drf_throttles(request))
            try:
                state = await ainner_door(request, [action], last=last, cost=cost)
                response = refusal(request, state)
                if response is None:
                    response = await view(request, *args, **kwargs)
                    if not last:  # DRF may have refused the request before the throttle that was to decide
                        state = await adecide_left_over(request, state)
                        response = refusal(request, state) or response
                    _with_headers(response, state)
                return await afinish(request, response)
            except BaseException:  # a CancelledError too: the client left while the request was decided or ran
                await alet_go(request)
                raise

        markcoroutinefunction(limited)
    else:

        @wraps(view)
        def limited(request, *args, **kwargs):
            if declared is not None:
                registry.ensure_synced(declared)  # a view module imported after the policies were loaded
            last = not decorator_inside and (not throttle_inside or passed_drf_throttles(request))
            try:
                state = inner_door(request, [action], last=last, cost=cost)
                response = refusal(request, state)
                if response is None:
                    response = view(request, *args, **kwargs)
                    if not last:  # DRF may have refused the request before the throttle that was to decide
                        state = decide_left_over(request, state)
                        response = refusal(request, state) or response
                    _with_headers(response, state)
                return finish(request, response)
            except BaseException:
                let_go(request)
                raise

    limited.ratelimit_actions = (*getattr(view, "ratelimit_actions", ()), action)
    if cost is not None:
        limited.ratelimit_cost = cost  # the policy tester shows it
    return _remember(limited, declared)


def _with_headers(response, state) -> None:
    if state is not None and state.decisions:
        headers.apply(response, state.decisions)


def _remember(view, declared: CodePolicy | None):
    if declared is not None:
        setattr(view, DECLARED_ATTRIBUTE, (*getattr(view, DECLARED_ATTRIBUTE, ()), declared.name))
    return view
