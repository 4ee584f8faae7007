"""URLs of the end-to-end run: one trivial view, plain, doing one PING (the floor), doing one
`limits` fixed-window hit (the leanest limiter: no policies, headers or live page), behind
django-ratelimit's and django-smart-ratelimit's decorators, and as a DRF view with no throttle, with
DRF's UserRateThrottle and with our PolicyThrottle; under ASGI, the same as an async view: plain,
doing one PING through redis.asyncio, and behind django-smart-ratelimit's aratelimit. BENCH_FIRST names
a route (its URL name or path) put first in the URLconf: each row of the end-to-end run and of
bench/request_instructions.py is served so, and every compared route resolves alike."""

from __future__ import annotations

import os

import redis.asyncio
from django.conf import settings
from django.http import HttpResponse
from django.urls import path
from django_redis import get_redis_connection
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import APIView

from ratelimit_app.decorators import ratelimit as our_ratelimit
from ratelimit_app.throttling import PolicyThrottle


def trivial(request):
    return HttpResponse("ok", content_type="text/plain")


def ping(request):
    get_redis_connection("default").ping()
    return trivial(request)


_kept = None


def ping_kept(request):
    """One PING on a redis-py connection the worker keeps: the least any Redis-backed limiter adds."""
    global _kept
    if _kept is None:  # made in the worker (after the fork)
        _kept = get_redis_connection("default").__class__(connection_pool=get_redis_connection("default")
                                                          .connection_pool, single_connection_client=True)
    _kept.ping()
    return trivial(request)


async def async_trivial(request):
    return HttpResponse("ok", content_type="text/plain")


_async_client = None


async def async_ping(request):
    global _async_client
    if _async_client is None:  # made in the worker's event loop, its one loop
        _async_client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    await _async_client.ping()
    return await async_trivial(request)


@our_ratelimit("bench-decorated")
def decorated(request):
    return trivial(request)


class Trivial(APIView):
    throttle_classes: list = []

    def get(self, request):
        return trivial(request)


class PingKept(Trivial):
    """The DRF view doing one PING: the floor of a DRF door that asks Redis, as ping_kept is of the others."""

    def get(self, request):
        return ping_kept(request)


class UserThrottled(Trivial):
    throttle_classes = [UserRateThrottle]


class PolicyThrottled(Trivial):
    throttle_classes = [PolicyThrottle]
    throttle_scope = "bench-drf"


urlpatterns = [
    # served with RateLimitMiddleware: p0 is matched by no policy, p1 by one, p3 by three
    path("p0/", trivial, name="p0"),
    path("p1/", trivial, name="p1"),
    path("p3/", trivial, name="p3"),
    path("p1-token-bucket/", trivial, name="p1-token-bucket"),  # one token bucket policy
    # served without it
    path("plain/", trivial, name="plain"),
    path("drf/", Trivial.as_view(), name="drf"),
    path("drf-ping-kept/", PingKept.as_view(), name="drf-ping-kept"),
    path("drf-user-throttle/", UserThrottled.as_view(), name="drf-user-throttle"),
    path("drf-policy-throttle/", PolicyThrottled.as_view(), name="drf-policy-throttle"),
    path("ping/", ping, name="ping"),
    path("ping-kept/", ping_kept, name="ping-kept"),
    path("decorated/", decorated, name="decorated"),  # our @ratelimit, one fixed-window policy
    # served by uvicorn (ASGI); with RateLimitMiddleware, async-p1 is matched by one policy
    path("async/plain/", async_trivial, name="async-plain"),
    path("async/p0/", async_trivial, name="async-p0"),
    path("async/p1/", async_trivial, name="async-p1"),
    path("async/ping/", async_ping, name="async-ping"),
]

try:
    from django_ratelimit.decorators import ratelimit
except ImportError:  # a peer of the bench only (bench/requirements.txt): its row is left out
    pass
else:
    urlpatterns.append(
        path("django-ratelimit/", ratelimit(key="ip", rate="1000000000/h", block=True)(trivial), name="django-ratelimit")
    )

try:
    from django_smart_ratelimit import aratelimit, rate_limit
except ImportError:  # a peer of the bench only (bench/requirements.txt): its rows are left out
    pass
else:  # its Redis backend, fixed window: bench/settings_e2e.py
    urlpatterns += [
        path("smart-ratelimit/", rate_limit(key="ip", rate="1000000000/h", block=True)(trivial), name="smart-ratelimit"),
        path("async/smart-ratelimit/", aratelimit(key="ip", rate="1000000000/h", block=True)(async_trivial),
             name="async-smart-ratelimit"),
    ]

try:
    from limits import parse
    from limits.storage import RedisStorage
    from limits.strategies import FixedWindowRateLimiter
except ImportError:  # a peer of the bench only (bench/requirements.txt): its row is left out
    pass
else:
    _rate = parse("1000000000/hour")
    _limiter = None

    def limits_hit(request):
        """The view behind one `limits` hit by client address, its storage made in the worker (after the fork)."""
        global _limiter
        if _limiter is None:
            _limiter = FixedWindowRateLimiter(RedisStorage(settings.REDIS_URL))
        if not _limiter.hit(_rate, "bench-e2e", request.META["REMOTE_ADDR"]):
            return HttpResponse("Too many requests", status=429)
        return trivial(request)

    urlpatterns.append(path("limits/", limits_hit, name="limits"))

if os.environ.get("BENCH_FIRST"):
    first = [pattern for pattern in urlpatterns if os.environ["BENCH_FIRST"] in (pattern.name, f"/{pattern.pattern}")]
    urlpatterns = first + [pattern for pattern in urlpatterns if pattern not in first]
