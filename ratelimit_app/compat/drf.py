"""DRF's throttles with DRF's API, decided exactly in one Redis call: change the import, keep the settings.

    from ratelimit_app.compat.drf import AnonRateThrottle, UserRateThrottle, ScopedRateThrottle

`rate`, `scope`, `THROTTLE_RATES` (DEFAULT_THROTTLE_RATES, read at call time), `cache_format`,
`get_cache_key()`, `get_ident()` with NUM_PROXIES, `timer` and `wait()` behave as in DRF. Each rate is
a policy from code in the admin (`drf-<scope>`), counted per the throttle's cache key with DRF's own
algorithm (a sliding log of request times), but atomically: concurrent requests never over-admit, and a
request refused by one throttle is counted by none.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from rest_framework import throttling as drf
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from .. import registry, strategies
from ..conf import get_setting
from ..engine import Decision
from ..lru import byte_bounded_cache
from ..rates import parse_rate
from ..registry import CodePolicy
from ..throttling import RateLimitUnavailable
from ..values import Unavailable
from . import door

logger = logging.getLogger("ratelimit_app")

__all__ = ["BaseThrottle", "SimpleRateThrottle", "AnonRateThrottle", "UserRateThrottle", "ScopedRateThrottle"]

DECISIONS_ATTRIBUTE = "_ratelimit_throttles"  # on DRF's Request: this dispatch's decisions, by policy and key


class _DefaultRates:
    """DEFAULT_THROTTLE_RATES read when used, not when the class is defined, so override_settings works."""

    def __get__(self, instance: object, owner: type) -> dict[str, Any]:
        return api_settings.DEFAULT_THROTTLE_RATES


class SimpleRateThrottle(drf.SimpleRateThrottle):
    """DRF's SimpleRateThrottle: subclasses give `scope` or `rate`, and `get_cache_key()`."""

    THROTTLE_RATES = _DefaultRates()
    ratelimit_door = True  # the middleware leaves the request's one call to the view's throttles
    policy_key = "user_or_ip"  # who the policy counts, as the admin shows it (the cache key decides)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own rate is a policy from its definition on: the admin lists it before any request."""
        super().__init_subclass__(**kwargs)
        rate = vars(cls).get("rate")
        if isinstance(rate, str):
            try:
                limit, window = parse_rate(rate)
            except ValueError:
                return  # refused when the throttle is used, as DRF does
            if limit == 0:
                return  # refuses everything without asking Redis, and has no policy
            name, origin = _naming(cls, getattr(cls, "scope", None), True)
            registry.register_policy(_code_policy(name, limit, window, cls.policy_key, origin))

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        """DRF's forms ('100/min', '1000/day') and shorter ones ('10/5m'); (None, None) for no rate."""
        return (None, None) if rate is None else parse_rate(rate)

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return not door.refused_by_other_policies(request)
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return not door.refused_by_other_policies(request)
        if self.num_requests == 0:
            return False  # '0/m': nothing is ever admitted, no need to ask
        self.now = self.timer()
        self.decision = self._decision(request, view)
        if door.refused_by_other_policies(request):
            return False  # a policy of the site refused the request in the same call
        return self.decision is None or self.decision.allowed

    def wait(self) -> float | None:
        """Seconds until a request would be admitted; DRF's estimate when a subclass kept its own history."""
        decision = getattr(self, "decision", None)
        if decision is not None:
            return decision.retry_after if decision.exceeded else None
        return super().wait() if hasattr(self, "history") else None

    # --- ratelimit_app's side -------------------------------------------------------------------

    def code_policy(self) -> CodePolicy:
        """The policy this throttle's rate stands for: `drf-<scope>`, or per class for a class's own rate."""
        cls = type(self)
        name, origin = _naming(cls, self.scope, getattr(cls, "rate", None) is not None)
        # registering an equal declaration again is a dictionary lookup; a changed rate replaces it
        return registry.register_policy(_code_policy(name, self.num_requests, self.duration, self.policy_key, origin))

    def _want(self, request, view) -> door.Want:
        return door.Want(self.code_policy(), door.subject(self.key))

    def _decision(self, request, view) -> Decision | None:
        want = self._want(request, view)
        key = (want.policy.name, want.subject.key)
        decided = getattr(request, DECISIONS_ATTRIBUTE, None) if view is not None else None
        if view is not None and (decided is None or decided[0] is not view):
            decided = (view, self._decide_view(request, view, want))
            setattr(request, DECISIONS_ATTRIBUTE, decided)
        if decided is not None and key in decided[1]:
            return decided[1][key]
        return self._decide(request, [want]).get(key)  # called on its own, outside its view's throttle_classes

    def _decide_view(self, request, view, want: door.Want) -> dict[tuple[str, str], Decision | None]:
        """Every compat throttle of the view in one call, so that DRF's loop over them costs one round trip."""
        wants = [want]
        for sibling in _siblings(view, self):
            sibling_want = sibling._prepared_want(request, view)
            if sibling_want is not None:
                wants.append(sibling_want)
        return self._decide(request, wants)

    def _prepared_want(self, request, view) -> door.Want | None:
        """What allow_request() will ask, worked out ahead of it (None when it will allow without asking)."""
        if self.rate is None:
            return None
        self.key = self.get_cache_key(request, view)
        return None if self.key is None else self._want(request, view)

    def _decide(self, request, wants: list[door.Want]) -> dict[tuple[str, str], Decision | None]:
        if not get_setting("RATELIMIT_ENABLED"):
            return {}
        now = None if self.timer is time.time else self.now  # DRF's tests move time by replacing the timer
        try:
            decisions = door.decide(request, wants, now=now)
        except Unavailable:  # Redis, or any failure of the limiter's (recorded): the failure rule
            if get_setting("RATELIMIT_FAIL_OPEN"):
                return {}
            raise RateLimitUnavailable() from None
        return {(want.policy.name, want.subject.key): decision for want, decision in zip(wants, decisions)}


_MISSING = object()


def _siblings(view, throttle: SimpleRateThrottle) -> list[SimpleRateThrottle]:
    get_throttles = getattr(view, "get_throttles", None)
    if get_throttles is None:
        return []
    return [t for t in get_throttles() if isinstance(t, SimpleRateThrottle) and type(t) is not type(throttle)]


@byte_bounded_cache(entry_bytes=1024)  # view classes and scopes: the code's own
def _naming(cls: type, scope: str | None, own_rate: bool) -> tuple[str, str]:
    name = registry.slug_name(f"{scope or ''}-{cls.__name__}" if own_rate else str(scope), prefix="drf-")
    return name, f"DRF throttle {cls.__module__}.{cls.__qualname__}" + (f" (scope {scope!r})" if scope else "")


@byte_bounded_cache(entry_bytes=4096)  # a declared policy: its names and texts
def _code_policy(name: str, limit: int, window: int, key: str, origin: str) -> CodePolicy:
    return registry.code_policy(
        name, action=f"drf:{name[4:]}", origin=origin, limit=limit, window=window, key=key,
        strategy=strategies.counting_like("drf"),
        description=f"Declared by {origin}; counted per the throttle's cache key.",
    )


class AnonRateThrottle(SimpleRateThrottle, drf.AnonRateThrottle):
    """Anonymous requests, per client address (DRF's get_ident: REMOTE_ADDR, or X-Forwarded-For with NUM_PROXIES)."""

    # Its own, as DRF's class has: inherited, it would follow our SimpleRateThrottle, which comes first in the MRO.
    scope = "anon"
    policy_key = "ip"


class UserRateThrottle(SimpleRateThrottle, drf.UserRateThrottle):
    """Per user when authenticated, per client address otherwise."""

    scope = "user"  # its own, as DRF's class has (see AnonRateThrottle)


class ScopedRateThrottle(SimpleRateThrottle, drf.ScopedRateThrottle):
    """The rate of the view's `throttle_scope` in THROTTLE_RATES, per user or client address."""

    def __init__(self) -> None:
        pass  # as in DRF: the rate is known once the view is

    def allow_request(self, request, view) -> bool:
        if not self._take_scope(view):
            return True
        return super().allow_request(request, view)

    def _prepared_want(self, request, view) -> door.Want | None:
        return super()._prepared_want(request, view) if self._take_scope(view) else None

    def _take_scope(self, view) -> bool:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return False
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return True


def _settings_policies() -> list[CodePolicy]:
    """Every scope of DEFAULT_THROTTLE_RATES shows in the admin before its first request."""
    found = []
    for scope, rate in (api_settings.DEFAULT_THROTTLE_RATES or {}).items():
        if rate is None:
            continue
        origin = f"DEFAULT_THROTTLE_RATES[{scope!r}]"
        try:
            limit, window = parse_rate(rate)
            key = AnonRateThrottle.policy_key if scope == AnonRateThrottle.scope else SimpleRateThrottle.policy_key
            found.append(_code_policy(registry.slug_name(str(scope), prefix="drf-"), limit, window, key, origin))
        except (ValueError, ImproperlyConfigured) as error:
            logger.error("ratelimit: %s is not used: %s", origin, error)
    return found


registry.add_provider(_settings_policies)
