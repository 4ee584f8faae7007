"""The rate limiter's cache beside another django-redis cache of the site on the same Redis (the
README's "a cache of its own"). django-redis keeps one connection pool per LOCATION for the whole
process, made with the OPTIONS of whichever cache connects first: on one LOCATION, the site's cache
would give the rate limiter its timeouts (none), or take the rate limiter's short ones. `manage.py
check` says so (W008); with a LOCATION of its own, as its hint says, each cache keeps its options."""

from __future__ import annotations

import pytest
from django.core.cache import caches
from django.core.checks import run_checks

from ratelimit_app import engine
from ratelimit_app.engine import RedisUnavailable
from tests.helpers import check, policy, stalled

pytestmark = pytest.mark.django_db
SHORT = {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}


def redis_cache(location: str | list, **options: object) -> dict:
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location, "OPTIONS": options}


def use(settings, site: dict, limits: dict) -> None:
    settings.CACHES = {**settings.CACHES, "site": site, "limits": limits}
    settings.RATELIMIT_CACHE = "limits"


def shared_location_warnings() -> list:
    return [message for message in run_checks() if message.id == "ratelimit_app.W008"]


def test_the_site_cache_on_the_same_location_with_other_options_is_reported(settings, private):
    use(settings, redis_cache(private.url), redis_cache(private.url, **SHORT))
    [warning] = shared_location_warnings()
    assert "'site'" in warning.msg and "redis://host:6379/1" in warning.hint


def test_a_location_list_sharing_one_server_is_reported(settings, private):
    replica = "redis://127.0.0.1:1/0"
    use(settings, redis_cache(f"{private.url},{replica}"), redis_cache([private.url], **SHORT))
    assert len(shared_location_warnings()) == 1


JSON = "django_redis.serializers.json.JSONSerializer"


@pytest.mark.parametrize("site_options", [SHORT, {**SHORT, "SERIALIZER": JSON}],
                         ids=["same options", "another serializer"])
def test_the_same_connection_options_on_one_location_are_not_reported(settings, private, site_options):
    use(settings, redis_cache(private.url, **site_options), redis_cache(private.url, **SHORT))
    assert shared_location_warnings() == []


def test_a_location_of_its_own_keeps_the_rate_limiter_its_timeouts(settings, private):
    """The hint followed (another database number): the site's cache connecting first, without timeouts,
    leaves the rate limiter its 0.25 s."""
    use(settings, redis_cache(private.url), redis_cache(private.url.replace("/0", "/1"), **SHORT))
    assert shared_location_warnings() == []
    caches["site"].set("greeting", "hello")  # the site's cache made its pool first
    compiled = policy(limit=5)
    assert engine.decide([check(compiled)]).allowed
    sleeping = stalled(private.port, 1.5)
    with pytest.raises(RedisUnavailable, match="Timeout"):  # 0.25 s, not however long Redis sleeps
        engine.decide([check(compiled)])
    sleeping.join()
    engine.breaker.reset()


def test_a_location_of_its_own_leaves_the_site_cache_without_the_rate_limiters_timeouts(settings, private):
    use(settings, redis_cache(private.url), redis_cache(private.url.replace("/0", "/1"), **SHORT))
    assert engine.decide([check(policy(limit=5))]).allowed  # the rate limiter connected first
    sleeping = stalled(private.port, 0.6)
    assert caches["site"].get("missing", "waited for") == "waited for"  # no 0.25 s timeout of the limiter's
    sleeping.join()
