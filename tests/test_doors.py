"""Where the doors meet: one call and all-or-nothing per request, whatever doors see it, through the
demo's real views (middleware + PolicyThrottle + @ratelimit, as a new user configures them)."""

from __future__ import annotations


import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from rest_framework.authtoken.models import Token
from rest_framework.decorators import api_view
from rest_framework.response import Response
from rest_framework.test import APIClient
from rest_framework.views import APIView

from ratelimit_app import engine, registry
from ratelimit_app.decorators import ratelimit
from ratelimit_app.policies import compile_policy, get_index
from tests.helpers import check, count_round_trips, in_processes, make_policy

pytestmark = pytest.mark.django_db

IP = "203.0.113.7"
WITHOUT_MIDDLEWARE = [m for m in django_settings.MIDDLEWARE if not m.startswith("ratelimit_app")]


def count_of(policy, who=f"ip:{IP}") -> int:
    """How many requests the policy counted for the subject (asked without counting)."""
    return engine.decide([check(compile_policy(policy), who)], dry_run=True).decisions[0].count


def round_trips(send) -> int:
    send()  # the first request loads the policy index; the second is the steady state
    with count_round_trips() as trips:
        send()
    return trips[0]


@pytest.fixture
def api():
    return APIClient(REMOTE_ADDR=IP)


def token_client(username: str) -> APIClient:
    user = User.objects.create_user(username)
    client = APIClient(REMOTE_ADDR=IP)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def demo_policies():
    """The demo's kinds of policy, all at once on every view."""
    return {
        "everywhere": make_policy(name="everywhere", action="*", limit=1000, key="ip"),
        "api": make_policy(name="api", action="/api/", limit=1000, key="ip"),
        "items": make_policy(name="items", action="items", limit=1000, key="user_or_ip", strategy="sliding_log"),
        "login": make_policy(name="login", action="login", limit=1000, key="ip", methods="POST"),
    }


# --- 1. one round trip per request, whatever doors see it ---------------------------------------


def test_middleware_alone_makes_one_call(client, demo_policies):
    assert round_trips(lambda: client.get("/demo/search/?q=a", REMOTE_ADDR=IP)) == 1


def test_middleware_and_drf_throttle_make_one_call_for_anonymous_session_and_token_users(api, demo_policies):
    assert round_trips(lambda: api.get("/api/items/")) == 1
    token = token_client("tina")
    assert round_trips(lambda: token.get("/api/items/")) == 1
    session = APIClient(REMOTE_ADDR=IP)
    session.force_login(User.objects.create_user("sam"))
    assert round_trips(lambda: session.get("/api/items/")) == 1


def test_middleware_and_decorator_make_one_call(client, demo_policies):
    assert round_trips(lambda: client.post("/demo/login/", REMOTE_ADDR=IP)) == 1


def test_decorator_or_throttle_alone_make_one_call(client, api, demo_policies, settings):
    settings.MIDDLEWARE = WITHOUT_MIDDLEWARE
    assert round_trips(lambda: client.post("/demo/login/", REMOTE_ADDR=IP)) == 1
    assert round_trips(lambda: api.get("/api/items/")) == 1


def test_no_call_when_no_policy_applies(client):
    make_policy(name="elsewhere", action="nowhere:else")
    assert round_trips(lambda: client.get("/demo/search/?q=a", REMOTE_ADDR=IP)) == 0
    assert round_trips(lambda: APIClient(REMOTE_ADDR=IP).get("/api/items/")) == 0


# --- 2. all-or-nothing across doors --------------------------------------------------------------


def test_logins_refused_by_the_decorator_leave_no_count_in_a_star_policy(client, demo_policies):
    login = make_policy(name="login-strict", action="login", limit=1, key="ip", methods="POST")
    statuses = [client.post("/demo/login/", REMOTE_ADDR=IP).status_code for _ in range(4)]
    assert statuses == [401, 429, 429, 429]
    assert count_of(demo_policies["everywhere"]) == 1
    assert count_of(login) == 1


def test_api_calls_refused_by_the_throttle_leave_no_count_in_star_or_prefix_policies(demo_policies):
    make_policy(name="items-strict", action="items", limit=1, key="user_or_ip")
    token = token_client("tina")  # a user policy: decided inside DRF, where the token user is known
    assert [token.get("/api/items/").status_code for _ in range(3)] == [200, 429, 429]
    assert count_of(demo_policies["everywhere"]) == 1
    assert count_of(demo_policies["api"]) == 1


def _post_logins(times, start, results):
    from django.test import Client

    client = Client()
    start.wait()
    results.put([client.post("/demo/login/", REMOTE_ADDR=IP).status_code for _ in range(times)])


def test_all_or_nothing_holds_for_two_processes_posting_at_once(demo_policies):
    login = make_policy(name="login-strict", action="login", limit=5, key="ip", methods="POST")
    registry.sync_pending()  # as at the first request, and the index loaded before the fork:
    get_index()  # the workers need no database (a forked child would share this process's connection)
    statuses = sum(in_processes(_post_logins, (40,), processes=2), [])
    assert statuses.count(401) == 5 and statuses.count(429) == 75
    assert count_of(login) == 5
    assert count_of(demo_policies["everywhere"]) == 5  # the 75 refusals were counted nowhere


# --- 3. token users are themselves ----------------------------------------------------------------


def test_two_token_users_behind_one_address_have_a_quota_each_under_a_star_user_policy():
    make_policy(name="per-user", action="*", limit=2, key="user")
    alice, bob = token_client("alice"), token_client("bob")
    assert [alice.get("/api/items/").status_code for _ in range(3)] == [200, 200, 429]
    assert [bob.get("/api/items/").status_code for _ in range(2)] == [200, 200]


def test_user_or_ip_prefix_policy_counts_token_users_as_themselves():
    make_policy(name="api-per-user", action="/api/", limit=1, key="user_or_ip")
    assert token_client("alice").get("/api/items/").status_code == 200
    assert token_client("bob").get("/api/items/").status_code == 200


def test_requests_failing_token_authentication_still_count_per_address():
    make_policy(name="api-per-ip", action="/api/", limit=2, key="ip")
    intruder = APIClient(REMOTE_ADDR=IP)
    intruder.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    # DRF answers 403 (session authentication is listed first); the third attempt is over the limit
    assert [intruder.get("/api/items/").status_code for _ in range(4)] == [403, 403, 429, 429]


# DRF views under @ratelimit alone (no middleware): the decorator must see what DRF refuses early.


class Guarded(APIView):
    def get(self, request):
        return Response({"ok": True})


GuardedByDecorator = ratelimit("guarded")(Guarded)  # @ratelimit on the class: it wraps dispatch


@api_view(["GET"])
def guarded_function(request):
    return Response({"ok": True})


@method_decorator(ratelimit("guarded"), name="get")
class GuardedMethod(APIView):
    def get(self, request):
        return Response({"ok": True})


urlpatterns = [
    path("method/", GuardedMethod.as_view(), name="guarded-method"),
    path("class/", GuardedByDecorator.as_view(), name="guarded-class"),
    path("wrapped/", ratelimit("guarded")(Guarded.as_view()), name="guarded-wrapped"),
    path("function/", ratelimit("guarded")(guarded_function), name="guarded-function"),
]
DECORATED_DRF_VIEWS = ["/class/", "/wrapped/", "/function/"]


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("middleware", [False, True], ids=["decorator-alone", "with-middleware"])
@pytest.mark.parametrize("url", DECORATED_DRF_VIEWS)
def test_decorator_counts_requests_drf_refuses_before_its_throttles(url, middleware, settings):
    if not middleware:
        settings.MIDDLEWARE = WITHOUT_MIDDLEWARE
    # a sliding log: a fixed window could start afresh at a minute boundary in the middle of the test
    make_policy(name="guarded-per-ip", action="guarded", limit=2, key="ip", strategy="sliding_log")
    intruder = APIClient(REMOTE_ADDR=IP)
    intruder.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    # a token guesser is refused by authentication first: its attempts count, so it meets the 429 too
    assert [intruder.get(url).status_code for _ in range(5)] == [403, 403, 429, 429, 429]
    assert [token_client(f"tina{n}").get(url).status_code for n in range(2)] == [429, 429]


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("url", [*DECORATED_DRF_VIEWS, "/method/"])
def test_decorator_alone_counts_drf_token_users_as_themselves_in_one_call(url, settings):
    settings.MIDDLEWARE = WITHOUT_MIDDLEWARE
    make_policy(name="guarded-per-user", action="guarded", limit=2, key="user")
    alice, bob = token_client("alice"), token_client("bob")
    assert [alice.get(url).status_code for _ in range(3)] == [200, 200, 429]
    assert round_trips(lambda: bob.get(url)) == 1
    assert bob.get(url).status_code == 429


@pytest.mark.urls(__name__)
def test_decorator_alone_decides_a_request_drf_refuses_early_in_one_call(settings):
    settings.MIDDLEWARE = WITHOUT_MIDDLEWARE
    make_policy(name="guarded-per-ip", action="guarded", limit=100, key="ip")
    make_policy(name="everywhere", action="*", limit=100, key="ip")
    intruder = APIClient(REMOTE_ADDR=IP)
    intruder.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert round_trips(lambda: intruder.get("/class/")) == 1


# --- 4. HEAD is GET --------------------------------------------------------------------------------


def test_head_requests_count_against_a_get_only_policy(client):
    make_policy(name="search-get", action="demo:search", limit=2, methods="GET")
    assert client.head("/demo/search/?q=a", REMOTE_ADDR=IP).status_code == 200
    assert client.head("/demo/search/?q=a", REMOTE_ADDR=IP).status_code == 200
    assert client.get("/demo/search/?q=a", REMOTE_ADDR=IP).status_code == 429


# --- 5. shadow policies are invisible to clients ------------------------------------------------


def test_shadow_policies_show_in_no_header_and_no_429_field(client, api):
    make_policy(name="tried-out", action="*", limit=1, key="ip", mode="shadow")
    make_policy(name="search-strict", action="demo:search", limit=1, key="ip")
    allowed = client.get("/demo/search/?q=a", REMOTE_ADDR=IP)
    assert allowed.headers["RateLimit-Policy"] == '"search-strict";q=1;w=60'
    denied = client.get("/demo/search/?q=a", REMOTE_ADDR=IP, HTTP_ACCEPT="application/json")
    assert "tried-out" not in denied.headers["RateLimit"] + denied.headers["RateLimit-Policy"]
    assert denied.json()["policy"] == "search-strict"
    assert "tried-out" not in denied.content.decode()
    assert "RateLimit" not in api.get("/api/items/").headers  # only the shadow policy applies there


# --- 6. one 429 shape ------------------------------------------------------------------------------


def test_drf_and_plain_views_refuse_with_the_same_json(client, api):
    make_policy(name="search-strict", action="demo:search", limit=1, key="ip")
    make_policy(name="items-strict", action="items", limit=1, key="ip")
    client.get("/demo/search/?q=a", REMOTE_ADDR=IP)
    api.get("/api/items/")
    plain = client.get("/demo/search/?q=a", REMOTE_ADDR=IP, HTTP_ACCEPT="application/json").json()
    drf = api.get("/api/items/", HTTP_ACCEPT="*/*").json()
    assert set(plain) == set(drf) == {"detail", "policy", "retry_after"}
    assert drf["policy"] == "items-strict" and isinstance(drf["retry_after"], int)


def test_refusals_are_text_when_json_is_not_acceptable(api):
    make_policy(name="items-strict", action="items", limit=1, key="ip")
    api.get("/api/items/")
    refused = api.get("/api/items/", HTTP_ACCEPT="text/html")
    assert refused.status_code == 429
    assert refused["Content-Type"].startswith("text/plain")
    assert "items-strict" in refused.content.decode()


def test_a_429_from_the_decorator_goes_through_the_middleware_inside_like_any_answer(client):
    make_policy(name="login-strict", action="login", limit=1, key="ip", methods="POST")
    admitted = client.post("/demo/login/", REMOTE_ADDR=IP)
    refused = client.post("/demo/login/", REMOTE_ADDR=IP)
    assert refused.status_code == 429
    # XFrameOptionsMiddleware stands inside RateLimitMiddleware in the demo, as in a new project
    assert admitted["X-Frame-Options"] == refused["X-Frame-Options"] == "DENY"
    assert refused["RateLimit-Policy"] == '"login-strict";q=1;w=60' and "Retry-After" in refused


def test_a_429_from_the_drf_throttle_keeps_what_the_middleware_inside_added(api):
    make_policy(name="items-strict", action="items", limit=1, key="ip")
    admitted = api.get("/api/items/")
    refused = api.get("/api/items/", HTTP_ACCEPT="application/json")
    assert refused.status_code == 429 and refused.json()["policy"] == "items-strict"
    assert admitted["X-Frame-Options"] == refused["X-Frame-Options"] == "DENY"
    assert refused["Content-Type"] == "application/json"


def test_a_refusal_in_place_of_an_answer_closes_the_file_that_answer_would_have_sent(rf):
    """The middleware refuses after DRF answered first (its 403 before the throttle ran): its refusal goes in
    place of that answer, whose file is never sent and is closed then, not left to the garbage collector."""
    from django.http import FileResponse

    from ratelimit_app.limiter import RequestState
    from ratelimit_app.responses import answer

    state = RequestState()
    state.unavailable = state.refused = True  # fail closed while Redis is down: a 503
    file = open(__file__, "rb")  # noqa: SIM115 - the refusal's answer() closes it
    replaced = FileResponse(file)
    replaced["X-Frame-Options"] = "DENY"
    refused = answer(rf.get("/"), replaced, state)
    assert refused.status_code == 503 and refused["X-Frame-Options"] == "DENY"
    assert file.closed


# --- 7. the operator is never locked out ---------------------------------------------------------


def test_the_apps_admin_pages_are_never_counted_or_refused(admin_client):
    everywhere = make_policy(name="everywhere", action="*", limit=2, key="ip")
    pages = [
        reverse("admin:ratelimit_app_policy_changelist"),
        reverse("admin:ratelimit_app_policy_change", args=[everywhere.pk]),
        reverse("admin:ratelimit_app_policy_live", args=[everywhere.pk]) + "?format=json",
        reverse("admin:ratelimit_app_policy_tester"),
        reverse("admin:ratelimit_app_policy_changes"),
    ]
    for page in pages * 3:
        assert admin_client.get(page, REMOTE_ADDR=IP).status_code == 200, page
    reset = admin_client.post(reverse("admin:ratelimit_app_policy_reset", args=[everywhere.pk]), REMOTE_ADDR=IP)
    assert reset.status_code == 302
    assert count_of(everywhere) == 0


def test_the_admin_login_stays_protected(client):
    make_policy(name="everywhere", action="*", limit=2, key="ip")
    statuses = [client.get(reverse("admin:login"), REMOTE_ADDR=IP).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


# --- 8. the tester sees decorators ---------------------------------------------------------------


def test_the_tester_lists_the_policies_of_a_decorated_view(admin_client):
    make_policy(name="login-per-ip", action="login", limit=3, key="ip", methods="POST")
    page = admin_client.post(
        reverse("admin:ratelimit_app_policy_tester"), {"method": "POST", "path": "/demo/login/", "ip": IP, "headers": ""}
    )
    assert page.status_code == 200
    assert "login-per-ip" in page.content.decode()


# --- 9. @ratelimit without parentheses ------------------------------------------------------------


def test_ratelimit_without_parentheses_fails_at_import_saying_how_to_use_it():
    from ratelimit_app.decorators import ratelimit

    with pytest.raises(TypeError, match=r"@ratelimit\('login'\)"):

        @ratelimit
        def view(request):  # pragma: no cover - never called
            return None
