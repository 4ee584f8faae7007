"""ratelimit_app.compat.django_ratelimit beyond django-ratelimit's own tests: policies in the admin,
refused requests not counted, one round trip, exactness under concurrent processes, RATELIMIT_VIEW."""

from __future__ import annotations


import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory, override_settings

from ratelimit_app import engine, registry
from ratelimit_app.engine import clients
from ratelimit_app.compat.django_ratelimit import Ratelimited, get_usage, is_ratelimited, ratelimit
from ratelimit_app.models import Policy
from tests.helpers import count_round_trips, in_processes

pytestmark = pytest.mark.django_db

rf = RequestFactory()


def usage(increment=True, ip="203.0.113.7", rate="2/m", **options):
    return get_usage(rf.get("/", REMOTE_ADDR=ip), group="search", key="ip", rate=rate, increment=increment, **options)


def test_each_group_and_rate_shows_in_the_admin_as_a_policy_from_code(admin_client):
    usage()
    row = Policy.objects.get(action="django-ratelimit:search")
    assert (row.source, row.limit, row.window, row.key, row.strategy) == ("code", 2, 60, "ip", "fixed_window")
    assert row.name == "rl-search-2-m-ip"
    assert '<td class="field-origin">code</td>' in admin_client.get("/admin/ratelimit_app/policy/").content.decode()


def test_a_decorated_views_policy_is_named_after_the_view():
    @ratelimit(key="user_or_ip", rate="5/h", method=ratelimit.UNSAFE)
    def post_comment(request):
        return request.limited

    request = rf.post("/")
    request.user = AnonymousUser()
    post_comment(request)
    row = Policy.objects.get(source="code", action__endswith=".post_comment")
    assert (row.limit, row.window, row.methods, row.key) == (5, 3600, "DELETE,PATCH,POST,PUT", "user_or_ip")


def test_a_fixed_rate_shows_in_the_admin_before_the_views_first_request(admin_client):
    @ratelimit(group="signup", key="ip", rate="3/h")
    def signup(request):
        return "ok"

    page = admin_client.get("/admin/ratelimit_app/policy/").content.decode()
    assert "rl-signup-3-h-ip" in page and '<td class="field-origin">code</td>' in page


def test_a_computed_rate_is_never_marked_no_longer_in_code(admin_client):
    def rate(group, request):
        return "2/m"

    is_ratelimited(rf.get("/"), group="computed", key="ip", rate=rate, increment=True)
    registry.undeclare(Policy.objects.get(action="django-ratelimit:computed").name)  # a fresh worker
    page = admin_client.get("/admin/ratelimit_app/policy/").content.decode()
    assert "no longer in code" not in page


def test_refused_requests_are_not_counted():
    assert [usage()["should_limit"] for _ in range(5)] == [False, False, True, True, True]
    row = Policy.objects.get(name="rl-search-2-m-ip")
    from ratelimit_app.live import live_usage
    from ratelimit_app.policies import compile_policy

    assert [s.count for s in live_usage(compile_policy(row)).subjects] == [2]  # django-ratelimit would hold 5


def test_the_operators_limit_and_shadow_mode_in_the_admin_apply():
    usage()
    row = Policy.objects.get(name="rl-search-2-m-ip")
    row.limit = 3
    row.save()
    assert [usage()["should_limit"] for _ in range(3)] == [False, False, True]
    row.mode = "shadow"
    row.save()
    assert usage()["should_limit"] is False


def test_one_round_trip_per_check():
    usage()  # writes and loads the policy
    with count_round_trips() as trips:
        usage()
    assert trips[0] == 1


def test_a_callable_rate_keeps_one_policy_per_window_with_the_limit_it_computes():
    def rate(group, request):
        return (3, 60) if request.GET.get("plan") == "pro" else "1/m"

    def check(plan):
        return is_ratelimited(rf.get("/", {"plan": plan}), group="plans", key="get:plan", rate=rate, increment=True)

    assert [check("pro") for _ in range(4)] == [False, False, False, True]
    assert [check("free") for _ in range(2)] == [False, True]
    assert Policy.objects.filter(action="django-ratelimit:plans").count() == 1


def test_header_and_parameter_values_are_shown_masked(admin_client):
    request = rf.get("/", HTTP_X_API_KEY="secret-key-1234")
    is_ratelimited(request, group="api", key="header:x-api-key", rate="5/m", increment=True)
    row = Policy.objects.get(action="django-ratelimit:api")
    data = admin_client.get(f"/admin/ratelimit_app/policy/{row.pk}/live/?format=json").json()
    assert [s["subject"] for s in data["subjects"]] == ["header:x-api-key=…1234"]


@pytest.mark.urls("tests.compat_urls")
def test_ratelimit_view_answers_through_the_middleware(client, settings):
    settings.RATELIMIT_VIEW = "tests.compat_urls.denied"
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "ratelimit_app.compat.django_ratelimit.RatelimitMiddleware"]
    assert [client.get("/contact/").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/contact/").content == b"slow down"


@pytest.mark.urls("tests.compat_urls")
def test_without_the_middleware_ratelimited_is_a_403_and_headers_are_set(client):
    responses = [client.get("/contact/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 403]
    assert responses[0]["RateLimit"].startswith('"rl-tests-compat-urls-contact-2-m-ip";r=1;t=')


def test_blocking_raises_ratelimited():
    @ratelimit(key="ip", rate="1/m")
    def view(request):
        return "ok"

    assert view(rf.get("/")) == "ok"
    with pytest.raises(Ratelimited):
        view(rf.get("/"))


@pytest.mark.usefixtures("outage_forgotten")
@override_settings(RATELIMIT_USE_CACHE="unreachable", CACHES={
    "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
    "unreachable": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
})
def test_an_unreachable_cache_fails_closed_by_default_as_django_ratelimit_does():
    try:
        assert usage()["should_limit"] is True
        with override_settings(RATELIMIT_FAIL_OPEN=True):
            assert usage() is None
    finally:
        engine.breaker.reset()


@override_settings(RATELIMIT_USE_CACHE="locmem", CACHES={
    "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
    "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
})
def test_a_cache_that_is_not_redis_is_refused_with_a_clear_message():
    with pytest.raises(Exception, match="django-redis"):
        usage()


# --- exactness under concurrency ---------------------------------------------------------------


def _attempts(start, results):
    start.wait()
    clients.forget_clients()  # a fresh connection in each process, as every worker has
    results.put(sum(not is_ratelimited(rf.get("/", REMOTE_ADDR="203.0.113.50"), group="exact", key="ip", rate="100/h", increment=True) for _ in range(100)))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_processes_hitting_one_subject_admit_exactly_the_limit():
    is_ratelimited(rf.get("/", REMOTE_ADDR="198.51.100.99"), group="exact", key="ip", rate="100/h", increment=True)
    assert sum(in_processes(_attempts)) == 100
