"""django-ratelimit 4.1's API, decided exactly in one Redis call: change the import, keep the settings.

    from ratelimit_app.compat.django_ratelimit import ratelimit, is_ratelimited, get_usage, Ratelimited

Keys (ip, user, user_or_ip, header:x, get:x, post:x, a dotted path or a callable), rates (strings,
tuples, dotted paths, callables), `request.limited`, and the settings RATELIMIT_ENABLE,
RATELIMIT_USE_CACHE, RATELIMIT_FAIL_OPEN, RATELIMIT_EXCEPTION_CLASS, RATELIMIT_IPV4_MASK,
RATELIMIT_IPV6_MASK, RATELIMIT_IP_META_KEY and RATELIMIT_VIEW (with RatelimitMiddleware) behave as
there. Each group and rate is a policy from code in the admin (fixed windows, as django-ratelimit
counts); a refused request is not counted, so a client that keeps retrying is not locked out longer.
"""

from __future__ import annotations

import functools
import math
from functools import wraps
from typing import Any, Callable

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.dummy import DummyCache
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.utils.module_loading import import_string

from .. import registry, strategies
from ..conf import get_setting
from ..boundary import DECORATOR
from ..engine import Decision
from ..lru import byte_bounded_cache
from ..rates import format_rate, parse_rate
from ..registry import CodePolicy
from ..values import Unavailable
from . import door
from .django_ratelimit_keys import get_ip as _get_ip  # noqa: F401 (django_ratelimit.core's name, imported by its users)
from .django_ratelimit_keys import key_label, key_value, subject

__all__ = ["ALL", "UNSAFE", "Ratelimited", "ratelimit", "is_ratelimited", "get_usage", "RatelimitMiddleware"]

ALL = (None,)  # every HTTP method
UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]
FAIL_CLOSED = {"count": 0, "limit": 0, "should_limit": True, "time_left": -1}  # django-ratelimit's answer


class Ratelimited(PermissionDenied):
    """Raised by a blocking @ratelimit over its limit: a 403, or RATELIMIT_VIEW's answer with the middleware."""


# --- the decorator ------------------------------------------------------------------------------


def ratelimit(group: str | None = None, key=None, rate=None, method=ALL, block: bool = True) -> Callable:
    """Count every call of the view; over the rate, set request.limited and (block=True) raise Ratelimited."""

    def decorator(fn):
        _declare_static(group, fn, key, rate, method)

        @wraps(fn)
        def _wrapped(request, *args, **kw):
            old_limited = getattr(request, "limited", False)
            ratelimited = is_ratelimited(
                request=request, group=group, fn=fn, key=key, rate=rate, method=method, increment=True)
            request.limited = ratelimited or old_limited
            if ratelimited and block:
                cls = getattr(settings, "RATELIMIT_EXCEPTION_CLASS", Ratelimited)
                raise (import_string(cls) if isinstance(cls, str) else cls)()
            return fn(request, *args, **kw)

        return _wrapped

    return decorator


ratelimit.ALL = ALL
ratelimit.UNSAFE = UNSAFE


class RatelimitMiddleware:
    """Answers Ratelimited with the view named by RATELIMIT_VIEW, called as view(request, exception)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, Ratelimited):
            return None
        return import_string(settings.RATELIMIT_VIEW)(request, exception)


def _declare_static(group, fn, key, rate, method) -> None:
    """A fixed rate's policy is known at import: the admin lists it before the view's first request."""
    if not key or rate is None or callable(rate) or (isinstance(rate, str) and "." in rate):
        return  # computed per request: declared when a request first meets it
    try:
        limit, window = parse_rate(rate)
    except ValueError:
        return  # refused when the view is called, as django-ratelimit does
    if limit > 0:
        policy = _policy(group if group is not None else _group_of(fn), limit, window, _methods(method), key_label(key))
        registry.declared_on(registry.view_path(fn), policy)  # the view's: declared again for a URLconf routing to it


# --- the functions ------------------------------------------------------------------------------


def is_ratelimited(request, group=None, fn=None, key=None, rate=None, method=ALL, increment: bool = False) -> bool:
    usage = get_usage(request, group, fn, key, rate, method, increment)
    return False if usage is None else usage["should_limit"]


def get_usage(request, group=None, fn=None, key=None, rate=None, method=ALL,
              increment: bool = False) -> dict[str, Any] | None:
    """{'count', 'limit', 'should_limit', 'time_left'}, or None when nothing limits this request.

    `increment=False` counts nothing and tells whether this request would be limited.
    """
    if group is None and fn is None:
        raise ImproperlyConfigured("get_usage must be called with either `group` or `fn` arguments")
    if not getattr(settings, "RATELIMIT_ENABLE", True) or not get_setting("RATELIMIT_ENABLED"):
        return None
    if not _method_match(request, method):
        return None
    group = group if group is not None else _group_of(fn)
    computed = callable(rate) or (isinstance(rate, str) and "." in rate)  # a function of (group, request)
    if computed:
        rate = (rate if callable(rate) else import_string(rate))(group, request)
    if rate is None:
        return None
    limit, window = _split_rate(rate)
    if not key:
        raise ImproperlyConfigured("Ratelimit key must be specified")
    value = key_value(key, group, request)
    if limit == 0:
        return {"count": int(increment), "limit": 0, "should_limit": True, "time_left": window}  # never admitted
    if not _counting_cache():
        return None  # a cache that keeps nothing limits nothing, as with django-ratelimit
    policy = _policy(group, None if computed else limit, window, _methods(method), key_label(key))
    want = door.Want(policy, subject(key, value), limit if computed else None)  # else the admin's limit
    try:
        decision = door.decide(request, [want], dry_run=not increment, door=DECORATOR)[0]
    except Unavailable:  # Redis, or any failure of the limiter's (recorded by the boundary)
        # a check that counts follows RATELIMIT_FAIL_OPEN (default False, as in django-ratelimit); one that
        # does not count cannot know and says "not limited", as django-ratelimit's cache lookup does
        fail_open = hasattr(settings, "RATELIMIT_FAIL_OPEN") and get_setting("RATELIMIT_FAIL_OPEN")  # "false" too
        return None if fail_open or not increment else dict(FAIL_CLOSED)
    return None if decision is None else _usage(decision, window)  # None: disabled in the admin, or exempt


def _usage(decision: Decision, window: int) -> dict[str, Any]:
    """django-ratelimit's dict; a refused request is reported in `count` though it is not stored."""
    left = decision.retry_after if decision.exceeded else decision.reset_in
    return {
        "count": decision.count + decision.exceeded,
        "limit": decision.limit,
        "should_limit": not decision.allowed,  # a shadow policy never limits
        "time_left": math.ceil(left) or window,
    }


is_ratelimited.ALL = ALL
is_ratelimited.UNSAFE = UNSAFE
get_usage.ALL = ALL
get_usage.UNSAFE = UNSAFE


def _split_rate(rate) -> tuple[int, int]:
    """'100/10m' -> (100, 600); a (limit, seconds) tuple as it is. ImproperlyConfigured for a bad rate."""
    try:
        return parse_rate(rate)
    except ValueError as error:
        raise ImproperlyConfigured(f"Ratelimit rate: {error}") from error


def _method_match(request, method=ALL) -> bool:
    if method == ALL:
        return True
    methods = method if isinstance(method, (list, tuple)) else [method]
    return request.method in [m.upper() for m in methods]


def _methods(method) -> str:
    if method == ALL:
        return ""
    methods = method if isinstance(method, (list, tuple)) else [method]
    return ",".join(sorted({m.upper() for m in methods}))


def _group_of(fn) -> str:
    """django-ratelimit's group for a view: its module and qualified name, so counters mean the same."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    parts = [fn.__module__] if hasattr(fn, "__module__") else []
    if hasattr(fn, "__self__"):
        parts.append(fn.__self__.__class__.__name__)
    parts.append(fn.__qualname__)
    return ".".join(parts)


# --- policies ------------------------------------------------------------------------------------

# the key spec the admin shows for each kind of key (the subject itself is computed here)
KEY_SPECS = {"ip": "ip", "user": "user", "user_or_ip": "user_or_ip"}


@byte_bounded_cache(entry_bytes=4096)  # a declared policy: its names and texts
def _code_policy(group: str, limit: int | None, window: int, methods: str, key: str) -> CodePolicy:
    rate = format_rate(limit, window) if limit is not None else f"computed per {window}s"
    name = registry.slug_name(f"{group}-{rate}-{methods}-{key}".replace("--", "-"), prefix="rl-")
    spec = KEY_SPECS.get(key) or ("header:" + key[7:] if key.startswith("header:") else None)
    if key.startswith(("get:", "post:")):
        spec = "param:" + key.split(":", 1)[1]
    origin = f"@ratelimit(group={group!r}, rate={rate!r}, key={key!r})"
    return registry.code_policy(
        name, action=f"django-ratelimit:{group}", origin=origin, limit=limit or 1, window=window,
        key=spec or "global", methods=methods, strategy=strategies.counting_like("django-ratelimit"),
        create_only=limit is None,
        description=(
            f"Declared by django-ratelimit's {origin}, counted per {key}"
            + ("; the limit is computed per request by the code" if limit is None else "") + "."
        ),
    )


def _policy(group: str, limit: int | None, window: int, methods: str, key: str) -> CodePolicy:
    return registry.register_policy(_code_policy(group, limit, window, methods, key))


# --- RATELIMIT_USE_CACHE -------------------------------------------------------------------------


def _counting_cache() -> bool:
    """False for a DummyCache; ImproperlyConfigured for a cache that is not django-redis."""
    alias = get_setting("RATELIMIT_CACHE")  # RATELIMIT_USE_CACHE when RATELIMIT_CACHE is not set (conf.py)
    cache = caches[alias]  # InvalidCacheBackendError for an alias that is not in CACHES, as django-ratelimit
    if isinstance(cache, DummyCache):
        return False
    if not type(cache).__module__.startswith("django_redis."):
        raise ImproperlyConfigured(
            f"RATELIMIT_USE_CACHE names the cache {alias!r}, a {type(cache).__name__}: ratelimit_app counts in "
            "Redis, through a django-redis cache (django_redis.cache.RedisCache)."
        )
    return True



