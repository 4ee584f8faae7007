"""The middleware limits plain Django views by URL name, path prefix, '*' and method."""

from __future__ import annotations

import inspect
import sys
from functools import partial
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches

import ratelimit_app

from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

IP = "203.0.113.7"


make = partial(make_policy, name="search-per-ip", action="demo:search", limit=2)


def get(client, path="/demo/search/?q=a", ip=IP, **extra):
    return client.get(path, REMOTE_ADDR=ip, **extra)


def statuses(client, times, path="/demo/search/?q=a", **extra):
    return [get(client, path, **extra).status_code for _ in range(times)]


def test_url_name_policy_denies_over_the_limit_with_429(client):
    make()
    assert statuses(client, 3) == [200, 200, 429]


def test_denial_carries_retry_after_and_the_ratelimit_headers(client):
    make(limit=1, window=60)
    get(client)
    denied = get(client)
    assert denied.status_code == 429
    retry_after = int(denied.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    assert denied.headers["RateLimit-Policy"] == '"search-per-ip";q=1;w=60'
    assert denied.headers["RateLimit"] == f'"search-per-ip";r=0;t={retry_after}'


def test_every_response_under_a_policy_has_the_headers(client):
    make(limit=5, strategy="sliding_log")
    first, second = get(client), get(client)
    assert first.headers["RateLimit"] == '"search-per-ip";r=4;t=60'
    assert second.headers["RateLimit"].startswith('"search-per-ip";r=3;t=')


def test_headers_list_every_applicable_policy(client):
    make(name="a-per-ip", limit=5)
    make(name="b-global", action="*", limit=100, window=3600, key="global")
    response = get(client)
    assert response.headers["RateLimit-Policy"] == '"b-global";q=100;w=3600, "a-per-ip";q=5;w=60'
    assert response.headers["RateLimit"].count(";r=") == 2


def test_responses_without_a_policy_have_no_headers(client):
    make()
    assert "RateLimit" not in client.get("/").headers


def test_path_prefix_policy(client):
    make(action="/demo/", limit=1)
    assert statuses(client, 2) == [200, 429]
    assert get(client, "/").status_code == 200


def test_star_policy_also_covers_unknown_paths(client):
    make(action="*", limit=2)
    assert statuses(client, 3, path="/no/such/page/") == [404, 404, 429]


def test_methods_restrict_a_policy(client):
    make(action="/demo/", methods="POST", limit=1)
    assert statuses(client, 3) == [200, 200, 200]
    assert [client.post("/demo/login/", REMOTE_ADDR=IP).status_code for _ in range(2)] == [401, 429]


def test_clients_are_counted_apart(client):
    make(limit=1)
    assert get(client, ip="198.51.100.1").status_code == 200
    assert get(client, ip="198.51.100.2").status_code == 200
    assert get(client, ip="198.51.100.1").status_code == 429


def test_denial_is_json_for_json_clients_and_text_otherwise(client):
    make(limit=1)
    get(client)
    as_json = get(client, HTTP_ACCEPT="application/json")
    assert as_json["Content-Type"] == "application/json"
    assert as_json.json()["policy"] == "search-per-ip"
    assert as_json.json()["retry_after"] == int(as_json.headers["Retry-After"])
    as_text = get(client, HTTP_ACCEPT="text/html")
    assert as_text["Content-Type"].startswith("text/plain")
    assert b"search-per-ip" in as_text.content


def custom_denial(request, state):
    from django.http import HttpResponse

    return HttpResponse(f"slow down, {state.denied[0].policy.name}", status=429)


def test_denial_response_can_be_replaced_by_a_view(client, settings):
    settings.RATELIMIT_DENIED_VIEW = "tests.test_middleware.custom_denial"
    make(limit=1)
    get(client)
    denied = get(client)
    assert denied.content == b"slow down, search-per-ip"
    assert "Retry-After" in denied.headers


def test_shadow_policy_never_denies_but_reports(client, caplog):
    make(mode="shadow", limit=1)
    caplog.set_level("INFO", logger="ratelimit_app")
    assert statuses(client, 3) == [200, 200, 200]
    assert "RateLimit" not in get(client).headers  # shadow policies never show to clients
    assert "shadow policy 'search-per-ip' would deny" in caplog.text


def test_denied_request_counts_nowhere(client):
    make(name="tight", limit=1)
    make(name="loose", action="*", limit=10)
    get(client)
    assert get(client).status_code == 429
    assert get(client, "/").headers["RateLimit"].startswith('"loose";r=8;')  # the home page is the 2nd counted


def test_disabled_policy_is_ignored(client):
    make(limit=1, enabled=False)
    assert statuses(client, 3) == [200, 200, 200]


def test_ratelimit_enabled_false_switches_everything_off(client, settings):
    settings.RATELIMIT_ENABLED = False
    make(limit=1)
    assert statuses(client, 3) == [200, 200, 200]


def test_user_policy_counts_logged_in_users_and_skips_anonymous(client):
    make(key="user", limit=1)
    assert statuses(client, 2) == [200, 200]  # anonymous: the policy does not apply
    client.force_login(User.objects.create_user("alice"))
    assert statuses(client, 2) == [200, 429]


def test_user_or_ip_counts_users_apart_from_their_address(client):
    make(key="user_or_ip", limit=1)
    assert get(client).status_code == 200
    client.force_login(User.objects.create_user("alice"))
    assert get(client).status_code == 200  # same address, now counted as user:alice
    assert get(client).status_code == 429


def test_header_key_counts_per_header_value_and_skips_requests_without_it(client):
    make(key="header:X-Api-Key", limit=1)
    assert statuses(client, 2, HTTP_X_API_KEY="key-one") == [200, 429]
    assert statuses(client, 1, HTTP_X_API_KEY="key-two") == [200]
    assert statuses(client, 2) == [200, 200]


def test_param_key_counts_per_parameter_value(client):
    make(key="param:q", limit=1)
    assert [get(client, "/demo/search/?q=ap").status_code for _ in range(2)] == [200, 429]
    assert get(client, "/demo/search/?q=gr").status_code == 200


def test_global_key_counts_everyone_together(client):
    make(key="global", limit=2)
    assert [get(client, ip=f"198.51.100.{i}").status_code for i in range(3)] == [200, 200, 429]


def test_composite_key_counts_each_combination(client):
    make(key="ip,header:User-Agent", limit=1)
    assert get(client, HTTP_USER_AGENT="curl").status_code == 200
    assert get(client, HTTP_USER_AGENT="firefox").status_code == 200
    assert get(client, HTTP_USER_AGENT="curl").status_code == 429


def test_forged_forwarded_for_from_an_untrusted_client_changes_nothing(client):
    make(limit=1)
    assert get(client, HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 200
    assert get(client, HTTP_X_FORWARDED_FOR="198.51.100.2").status_code == 429


def test_trusted_proxy_forwarded_address_is_the_subject(client, settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.0/8"]
    make(limit=1)
    assert get(client, ip="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 200
    assert get(client, ip="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.2").status_code == 200
    assert get(client, ip="10.0.0.3", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 429


def test_steady_state_requests_make_no_database_query(client, django_assert_num_queries):
    make(limit=100)
    get(client)  # loads the policy index
    with django_assert_num_queries(0):
        for _ in range(5):
            assert get(client).status_code == 200


def generators_resumed(send) -> int:
    """How many times a generator of the app's (steps, a driver's loop) starts or resumes while `send()` runs."""
    app = str(Path(ratelimit_app.__file__).parent)
    resumed = [0]

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_flags & inspect.CO_GENERATOR and code.co_filename.startswith(app):
            resumed[0] += 1

    sys.setprofile(profile)
    try:
        send()
    finally:
        sys.setprofile(None)
    return resumed[0]


def test_a_sync_request_resumes_no_generator_whatever_steps_decide_it(client):
    """The door's steps, the engine's and the script's are plain calls on the sync path (their @steps twin):
    a generator resumed per I/O cost every request of the one-policy row about 20k instructions."""
    make(limit=100)
    get(client)  # the first requests load the policy index and resolve their routes
    get(client, "/")
    assert generators_resumed(lambda: get(client)) == 0
    assert generators_resumed(lambda: get(client, "/")) == 0  # no policy meets it


def test_a_policy_saved_in_this_process_applies_to_the_next_request(client):
    policy = make(limit=100)
    get(client)
    policy.limit = 2  # a new limit keeps what was counted
    policy.save()
    assert statuses(client, 2) == [200, 429]
    policy.delete()
    assert statuses(client, 2) == [200, 200]


def test_a_request_leaves_django_no_cache_of_the_app_to_close_at_its_end(client, settings):
    # Django closes, at every request's end, each cache its thread opened: one the app opened would cost
    # every later request of the thread (the demo's "default" is opened by this suite's fixtures)
    settings.CACHES = {**settings.CACHES, "ratelimit": settings.CACHES["default"]}
    settings.RATELIMIT_CACHE = "ratelimit"
    make()
    opened = len(caches.all(initialized_only=True))
    assert statuses(client, 3) == [200, 200, 429]  # the app's client asked Redis
    assert get(client, "/").status_code == 200  # a route no policy meets
    assert len(caches.all(initialized_only=True)) == opened


def test_a_route_no_policy_met_is_limited_from_the_request_after_a_policy_for_it_is_saved(client):
    make(name="elsewhere", action="/nowhere/")  # the route meets none: the middleware keeps that it met none
    assert statuses(client, 3) == [200, 200, 200]
    make(limit=1)
    assert statuses(client, 2) == [200, 429]


def test_a_path_no_policy_met_is_limited_once_the_urlconf_routes_it_to_a_view_a_policy_names(client, settings):
    make(name="pages", action="tests.routed_urls.page", limit=1)
    assert statuses(client, 2, "/about/") == [404, 404]  # the demo routes it nowhere
    settings.ROOT_URLCONF = "tests.routed_urls"
    assert statuses(client, 2, "/about/") == [200, 429]


def test_redis_down_fail_open_lets_requests_through(client, settings, caplog):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    make(limit=1)
    assert statuses(client, 3) == [200, 200, 200]
    assert caplog.text.count("Redis unavailable") == 1


def test_redis_down_fail_closed_answers_503_with_retry_after(client, settings):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    settings.RATELIMIT_FAIL_OPEN = False
    make(limit=1)
    response = get(client)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_view_that_lets_unavailable_through_is_answered_503_saying_what_is_true_in_both_modes(client, settings,
                                                                                                fail_open):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    settings.RATELIMIT_FAIL_OPEN = fail_open
    settings.ROOT_URLCONF = "tests.usage_urls"
    make_policy(name="api-per-ip", action="/api/", limit=100)  # usage() asks Redis for it, and cannot
    response = client.get("/api/usage/")
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert response.content.decode() == "Rate limiting is unavailable. Retry shortly.\n"


def test_a_request_without_the_header_a_per_key_policy_counts_is_not_limited_by_it(client):
    make_policy(name="api-per-key", action="demo:search", limit=1, key="header:X-Api-Key")
    assert [get(client).status_code for _ in range(3)] == [200, 200, 200]  # no key: no subject, not counted
    assert [get(client, HTTP_X_API_KEY="k1").status_code for _ in range(2)] == [200, 429]


def test_a_settings_change_decides_who_a_request_is_from_anew_on_a_route_already_seen(client, settings):
    # the middleware keeps a route's checks per client address: trusting a proxy from now on must count the
    # address it forwards, not the proxy's seen before
    make(key="ip", limit=1)
    assert get(client, ip="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.1").status_code == 200
    assert get(client, ip="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.2").status_code == 429
    settings.RATELIMIT_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert get(client, ip="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.3").status_code == 200
    assert get(client, ip="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.3").status_code == 429


def test_a_route_seen_from_one_address_counts_another_address_apart(client):
    make(key="ip", limit=1)
    assert [get(client, ip=f"198.51.100.{i}").status_code for i in (1, 1, 2, 2)] == [200, 429, 200, 429]
