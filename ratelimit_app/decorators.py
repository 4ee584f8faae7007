"""@ratelimit("login"): the policies of an action, on a function view, a view method or a View class."""

from __future__ import annotations

from functools import wraps

from django.utils.decorators import method_decorator

from . import headers
from .doors import has_door_inside, inner_door
from .responses import refusal


def ratelimit(action: str):
    """Enforce the policies whose action is `action` before the view runs (429 when one denies)."""
    if callable(action):
        raise TypeError(
            "@ratelimit needs an action: write @ratelimit(\"login\") (the policies whose action is 'login'), "
            "not @ratelimit without parentheses."
        )

    def decorator(view):
        if isinstance(view, type):  # a class-based view: decorate its dispatch
            return method_decorator(decorator, name="dispatch")(view)
        last = not has_door_inside(view)

        @wraps(view)
        def limited(request, *args, **kwargs):
            state = inner_door(request, [action], last=last)
            refused = refusal(request, state)
            if refused is not None:
                return refused
            response = view(request, *args, **kwargs)
            if state is not None and state.decisions:
                headers.apply(response, state.decisions)
            return response

        limited.ratelimit_actions = (*getattr(view, "ratelimit_actions", ()), action)
        return limited

    return decorator
