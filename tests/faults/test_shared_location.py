"""The rate limiter's cache on the same LOCATION as another django-redis cache of the site (the README's
"a cache of its own", pointed at the Redis the site already uses): each keeps its own OPTIONS.
django-redis keeps one pool per LOCATION for the whole process, made with the OPTIONS of whichever
cache connected first."""

from __future__ import annotations

import pytest
from django.core.cache import caches

from ratelimit_app import engine
from ratelimit_app.engine import RedisUnavailable
from tests.helpers import check, policy, stalled

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_caches(settings, private):
    """The site's own cache, without timeouts (a slow command is its business), and the rate limiter's
    on the same LOCATION, with the README's short ones."""
    settings.CACHES = {**settings.CACHES,
                       "site": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": private.url},
                       "limits": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": private.url,
                                  "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}}}
    settings.RATELIMIT_CACHE = "limits"
    return private


def test_the_site_cache_connecting_first_leaves_the_rate_limiter_its_timeouts(two_caches):
    caches["site"].set("greeting", "hello")  # the site's cache made django-redis's pool of this LOCATION
    compiled = policy(limit=5)
    assert engine.decide([check(compiled)]).allowed
    sleeping = stalled(two_caches.port, 1.5)
    with pytest.raises(RedisUnavailable, match="Timeout"):  # 0.25 s, not however long Redis sleeps
        engine.decide([check(compiled)])
    sleeping.join()
    engine.breaker.reset()


def test_the_rate_limiter_connecting_first_leaves_the_site_cache_without_its_timeouts(two_caches):
    assert engine.decide([check(policy(limit=5))]).allowed  # the rate limiter connected first
    sleeping = stalled(two_caches.port, 0.6)
    assert caches["site"].get("missing", "waited for") == "waited for"  # no 0.25 s timeout of the limiter's
    sleeping.join()
