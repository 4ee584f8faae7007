"""RateLimitMiddleware: every request, by URL name, path prefix, '*' and method. Place it after
AuthenticationMiddleware so `user` policies see the user."""

from __future__ import annotations

from functools import lru_cache

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.urls import Resolver404, resolve

from . import headers
from .limiter import STATE_ATTRIBUTE, evaluate
from .policies import get_index
from .responses import refusal


@lru_cache(maxsize=None)
def _throttled_by_policies(view_class: type | None) -> bool:
    """Whether a DRF view runs PolicyThrottle, which knows users authenticated by DRF (tokens)."""
    from .throttling import PolicyThrottle

    classes = getattr(view_class, "throttle_classes", None) or ()
    return any(isinstance(c, type) and issubclass(c, PolicyThrottle) for c in classes)


def request_names(request) -> tuple[tuple[str | None, ...], bool]:
    """The names policies can match (URL name, a DRF view's throttle_scope), and whether PolicyThrottle
    will see the request too."""
    if not get_index().by_name:
        return (), False  # only '*' and path policies: no need to resolve the URL
    return _names_of_path(request.path_info, getattr(request, "urlconf", None))


@lru_cache(maxsize=2048)
def _names_of_path(path: str, urlconf: str | None) -> tuple[tuple[str | None, ...], bool]:
    # bounded: a client inventing paths only evicts entries, and resolving again is always correct
    try:
        match = resolve(path, urlconf)
    except Resolver404:
        return (), False
    view_class = getattr(match.func, "cls", None) or getattr(match.func, "view_class", None)
    return (match.view_name, getattr(view_class, "throttle_scope", None)), _throttled_by_policies(view_class)


@receiver(setting_changed, dispatch_uid="ratelimit_urlconf_changed")
def _forget_names(setting: str, **kwargs: object) -> None:
    if setting == "ROOT_URLCONF":
        _names_of_path.cache_clear()


class RateLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        names, throttled = request_names(request)
        # user policies of a DRF view are left to the throttle when the user is not known yet (tokens)
        refused = refusal(request, evaluate(request, names, defer_anonymous_user_policies=throttled))
        if refused is not None:
            return refused
        response = self.get_response(request)
        state = request.__dict__.get(STATE_ATTRIBUTE)  # the throttle or a decorator may have added to it
        if state is not None and state.decisions:
            headers.apply(response, state.decisions)
        return response
