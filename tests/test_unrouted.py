"""A policy whose action nothing the site routes never applies: `manage.py check` says so (W012), and so
does the admin where the policy is edited."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks

from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/ratelimit_app/policy/"


def unrouted_warnings(databases=("default",)) -> list[str]:
    return [m.msg for m in run_checks(databases=list(databases)) if m.id == "ratelimit_app.W012"]


@pytest.mark.parametrize("action, said", [
    ("api:serch", "the name 'api:serch', which no URL name, throttle_scope or @ratelimit action has"),
    ("demo:serch", "the name 'demo:serch', which no URL name, throttle_scope or @ratelimit action has "
                   "(did you mean 'demo:search'?)"),
    ("api-item", "(did you mean 'api-items'?)"),
    ("/nope/", "the path prefix '/nope/', and no URL pattern routes a path that starts with it"),
    ("/api/items/more/", "the path prefix '/api/items/more/', and no URL pattern routes"),
])
def test_a_policy_whose_action_nothing_routes_is_reported_with_what_it_names(action, said):
    make_policy(name="typo", action=action)
    warnings = unrouted_warnings()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("Policy 'typo' never applies: its action is ")
    assert said in warnings[0]


def test_each_unrouted_policy_is_named_and_a_row_is_read_with_database_only():
    make_policy(name="first", action="api:serch")
    make_policy(name="second", action="/nope/")
    assert unrouted_warnings(databases=()) == []
    assert [w.split(":")[0] for w in unrouted_warnings()] == ["Policy 'first' never applies", "Policy 'second' never applies"]


@pytest.mark.parametrize("action", [
    "*", "/", "/api/", "/api/items", "/api/items/", "/demo/", "/admin/anything/", "demo:search", "api-items",
    "login",  # a plain name: code may count it with hit() or check()
    "drf:user", "django-ratelimit:login",  # the compatibility modules count these themselves
])
def test_an_action_the_demo_routes_is_not_reported(action):
    make_policy(name="fine", action=action)
    assert unrouted_warnings() == []


@pytest.mark.parametrize("action", [
    "api:search", "api:item", "searches", "login-attempts", "login", "tests.routed_urls.page",
    "/api/v1/", "/api/v1/items/7/", "/api", "/files/any/thing", "/report/", "/about/",
])
def test_url_names_namespaces_throttle_scopes_decorator_actions_and_prefixes_are_read(settings, action):
    settings.ROOT_URLCONF = "tests.routed_urls"
    make_policy(name="fine", action=action)
    assert unrouted_warnings() == []


@pytest.mark.parametrize("action", ["api:serch", "searchs", "/api/v2/", "/about/more/", "/api/v1/searches/", "/filez/"])
def test_unrouted_actions_are_reported_against_the_urlconf_in_use(settings, action):
    settings.ROOT_URLCONF = "tests.routed_urls"
    make_policy(name="typo", action=action)
    assert len(unrouted_warnings()) == 1


def test_no_prefix_is_reported_where_a_regex_route_may_match_anywhere(settings):
    settings.ROOT_URLCONF = "tests.unanchored_urls"
    make_policy(name="fine", action="/x/feeds/")
    make_policy(name="also", action="/nope/")
    assert unrouted_warnings() == []


def test_a_settings_policy_whose_action_nothing_routes_is_reported_without_a_database(settings):
    settings.RATELIMIT_POLICIES = [{"name": "settings-typo", "action": "/nope/", "rate": "10/m"}]
    warnings = unrouted_warnings(databases=())
    assert len(warnings) == 1 and warnings[0].startswith("Policy 'settings-typo' never applies")


# --- the admin ----------------------------------------------------------------------------------------


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_the_change_page_of_an_unrouted_policy_warns_naming_it(admin_client):
    policy = make_policy(name="typo", action="api:serch")
    said = messages_of(admin_client.get(f"{CHANGELIST}{policy.pk}/change/"))
    assert said == [
        "Policy 'typo' never applies: its action is the name 'api:serch', which no URL name, throttle_scope or "
        "@ratelimit action has. Fix its action, or use the policy tester to see the names a path is known by."
    ]


def test_saving_an_unrouted_policy_warns_once_naming_it(admin_client):
    form = {
        "name": "nowhere", "action": "/nope/", "limit": "100", "window": "60", "strategy": "fixed_window",
        "key": "ip", "methods": "", "mode": "enforce", "enabled": "on", "bucket_size": "", "description": "",
        "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0", "overrides-MIN_NUM_FORMS": "0",
        "overrides-MAX_NUM_FORMS": "1000",
    }
    for button in ("_save", "_continue"):
        form["name"] = f"nowhere{button}"
        response = admin_client.post(f"{CHANGELIST}add/", {**form, button: "1"}, follow=True)
        warned = [m for m in messages_of(response) if "never applies" in m]
        assert warned == [f"Policy 'nowhere{button}' never applies: its action is the path prefix '/nope/', and no URL "
                          "pattern routes a path that starts with it. Fix its action, or use the policy tester to see "
                          "the names a path is known by."], button


def test_a_routed_policy_is_saved_and_shown_without_a_warning(admin_client):
    policy = make_policy(name="fine", action="demo:search")
    assert not [m for m in messages_of(admin_client.get(f"{CHANGELIST}{policy.pk}/change/")) if "never" in m]
