"""@ratelimit("login"): the policies of an action, on a function view, a view method or a View class."""

from __future__ import annotations

from functools import wraps

from django.utils.decorators import method_decorator

from . import headers
from .limiter import evaluate
from .responses import refusal


def ratelimit(action: str):
    """Enforce the policies whose action is `action` before the view runs (429 when one denies)."""

    def decorator(view):
        if isinstance(view, type):  # a class-based view: decorate its dispatch
            return method_decorator(decorator, name="dispatch")(view)

        @wraps(view)
        def limited(request, *args, **kwargs):
            state = evaluate(request, [action])
            refused = refusal(request, state)
            if refused is not None:
                return refused
            response = view(request, *args, **kwargs)
            if state is not None and state.decisions:
                headers.apply(response, state.decisions)
            return response

        return limited

    return decorator
