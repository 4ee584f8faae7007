"""@ratelimit("login"): the policies of an action, on a function view, a view method or a View class,
sync or async."""

from __future__ import annotations

from functools import partial, wraps

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.utils.decorators import method_decorator

from . import headers
from .doors import ainner_door, has_door_inside, inner_door
from .responses import refusal


def ratelimit(action: str):
    """Enforce the policies whose action is `action` before the view runs (429 when one denies)."""
    if callable(action):
        raise TypeError(
            "@ratelimit needs an action: write @ratelimit(\"login\") (the policies whose action is 'login'), "
            "not @ratelimit without parentheses."
        )
    return partial(_decorate, action=action)


def _decorate(view, *, action: str, is_async: bool | None = None):
    if isinstance(view, type):  # a class-based view: decorate its dispatch (which returns a coroutine when async)
        return method_decorator(partial(_decorate, action=action, is_async=view.view_is_async), name="dispatch")(view)
    last = not has_door_inside(view)
    if is_async is None:
        is_async = iscoroutinefunction(view)

    if is_async:

        @wraps(view)
        async def limited(request, *args, **kwargs):
            state = await ainner_door(request, [action], last=last)
            refused = refusal(request, state)
            if refused is not None:
                return refused
            return _with_headers(await view(request, *args, **kwargs), state)

        markcoroutinefunction(limited)
    else:

        @wraps(view)
        def limited(request, *args, **kwargs):
            state = inner_door(request, [action], last=last)
            refused = refusal(request, state)
            if refused is not None:
                return refused
            return _with_headers(view(request, *args, **kwargs), state)

    limited.ratelimit_actions = (*getattr(view, "ratelimit_actions", ()), action)
    return limited


def _with_headers(response, state):
    if state is not None and state.decisions:
        headers.apply(response, state.decisions)
    return response
