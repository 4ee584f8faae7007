"""Policies declared in code: rate strings, @ratelimit(rate=...), RATELIMIT_POLICIES, syncing to the
database, and the admin's marks, changes and revert."""

from __future__ import annotations

import json

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from ratelimit_app import registry
from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import Policy
from ratelimit_app.policies import get_index
from ratelimit_app.rates import format_rate, parse_rate
from tests.helpers import count_round_trips

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/ratelimit_app/policy/"
LOGIN_POLICY = "tests-code-urls-login"


def change_form(policy: Policy, **changes) -> dict:
    values = {
        "description": policy.description, "enabled": "on" if policy.enabled else "", "mode": policy.mode,
        "limit": policy.limit, "window": policy.window, "strategy": policy.strategy, "bucket_size": policy.bucket_size or "",
        "rate": "", "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0", "overrides-MIN_NUM_FORMS": "0",
        "overrides-MAX_NUM_FORMS": "1000",
    }
    values.update(changes)
    return {k: v for k, v in values.items() if v != ""}


def login_policy() -> Policy:
    """The row of tests.code_urls.login, which the URLconf in use (tests.code_urls) routes to."""
    registry.sync()
    return Policy.objects.get(name=LOGIN_POLICY)


# --- rate strings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rate, expected",
    [
        ("5/s", (5, 1)), ("100/m", (100, 60)), ("1000/h", (1000, 3600)), ("10/5m", (10, 300)), ("800/d", (800, 86400)),
        ("5/min", (5, 60)), ("3/sec", (3, 1)), ("100/hour", (100, 3600)), ("1000/day", (1000, 86400)),
        ("100/10s", (100, 10)), ("100/10", (100, 10)), ("0/m", (0, 60)), (" 7 / 2h ", (7, 7200)), ((3, 60), (3, 60)),
    ],
)
def test_rate_strings_of_every_library_are_read(rate, expected):
    assert parse_rate(rate) == expected


@pytest.mark.parametrize(
    "rate, message",
    [("five/m", "is not a rate"), ("5/week", "unknown period 'week'"), ("5/", "no period"), ("5/0s", "at least 1 second"), ("", "is not a rate")],
)
def test_bad_rate_strings_say_what_is_wrong(rate, message):
    with pytest.raises(ValueError, match=message):
        parse_rate(rate)


def test_a_mistyped_unit_is_answered_with_every_unit_a_rate_may_have():
    with pytest.raises(ValueError) as refused:
        parse_rate("10/mn")
    said = str(refused.value)
    assert said.startswith("'10/mn': unknown period 'mn'; a window of seconds is written with s, m, h or d")
    assert "a calendar quota with week, month or calendar-day" in said


def test_rates_are_written_back_in_their_shortest_form():
    assert [format_rate(*r) for r in ((5, 60), (10, 300), (7, 90), (1, 86400))] == ["5/m", "10/5m", "7/90s", "1/d"]
    assert parse_rate(format_rate(7, 90)) == (7, 90)


# --- the decorator ------------------------------------------------------------------------------


def test_bare_decorator_fails_at_import_with_how_to_use_it():
    with pytest.raises(TypeError, match=r"@ratelimit\('login'\).*@ratelimit\(rate='5/m', key='ip'\)"):

        @ratelimit
        def view(request):
            return None


def test_a_bad_declaration_fails_at_import_naming_the_view():
    with pytest.raises(ImproperlyConfigured, match=r"@ratelimit on .*\.view: 'five/m' is not a rate"):

        @ratelimit(rate="five/m", key="ip")
        def view(request):
            return None

    with pytest.raises(ImproperlyConfigured, match="Unknown key kind"):

        @ratelimit(rate="5/m", key="ipp")
        def other(request):
            return None


@pytest.mark.urls("tests.code_urls")
def test_decorator_declares_a_policy_from_code_named_after_the_view():
    policy = login_policy()
    assert (policy.source, policy.action, policy.limit, policy.window, policy.key) == ("code", "code:tests.code_urls.login", 2, 60, "ip")
    assert policy.code_values["limit"] == 2
    shadow = Policy.objects.get(name="comments-per-ip")
    assert (shadow.mode, shadow.methods) == ("shadow", "POST")


@pytest.mark.urls("tests.code_urls")
def test_the_declared_policy_enforces_through_the_site(client):
    assert [client.get("/login/").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/open/").status_code == 200
    assert client.get("/login/")["RateLimit-Policy"] == f'"{LOGIN_POLICY}";q=2;w=60'


@pytest.mark.urls("tests.code_urls")
def test_a_declared_policy_on_a_class_based_view_counts_its_methods(client):
    assert [client.get("/signup/").status_code for _ in range(3)] == [200, 200, 200]
    assert [client.post("/signup/").status_code for _ in range(2)] == [200, 429]


def test_a_declared_policy_enforces_when_its_module_is_imported_after_the_policies_loaded(rf):
    get_index()  # loaded before the view below exists

    @ratelimit(rate="1/m", key="ip", name="late-view")
    def late(request):
        from django.http import HttpResponse

        return HttpResponse("ok")

    assert [late(rf.get("/", REMOTE_ADDR="203.0.113.9")).status_code for _ in range(2)] == [200, 429]


def test_stacked_declarations_on_one_view_get_different_names_and_are_decided_in_one_call(rf):
    from django.http import HttpResponse

    @ratelimit(rate="3/m", key="user_or_ip")
    @ratelimit(rate="2/m", key="ip")
    def view(request):
        return HttpResponse("ok")

    first, second = (registry.declared(name) for name in view._ratelimit_declared)
    assert first.name != second.name
    assert {first.values["key"], second.values["key"]} == {"ip", "user_or_ip"}
    view(rf.get("/", REMOTE_ADDR="198.51.100.1"))  # the index loaded, the scripts in Redis
    with count_round_trips() as trips:
        answers = [view(rf.get("/", REMOTE_ADDR="203.0.113.9")) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert answers[0]["RateLimit-Policy"].count(";q=") == 2  # both policies apply to the view
    assert trips[0] == 3  # one call per request


@pytest.mark.urls("tests.faults.code_urls")
def test_one_view_routed_twice_with_two_rates_enforces_each_as_written(client):
    """path("two/", ratelimit(rate="2/m")(shared)) and path("five/", ratelimit(rate="5/m")(shared))."""
    assert [client.get("/two/").status_code for _ in range(6)] == [200] * 2 + [429] * 4
    assert [client.get("/five/").status_code for _ in range(6)] == [200] * 5 + [429]
    assert client.get("/two/")["RateLimit-Policy"].count(";q=") == 1  # the other route's policy is not here


@pytest.mark.urls("tests.faults.code_urls")
def test_named_declarations_on_one_view_apply_to_their_own_route_only(client):
    assert [client.get("/named-two/").status_code for _ in range(3)] == [200, 200, 429]
    assert [client.get("/named-five/").status_code for _ in range(6)] == [200] * 5 + [429]
    assert client.get("/named-five/")["RateLimit-Policy"] == '"fault-named-five";q=5;w=60'


def test_the_same_declaration_written_twice_on_a_view_is_one_policy(rf):
    from django.http import HttpResponse

    def view(request):
        return HttpResponse("ok")

    first, second = ratelimit(rate="2/m", key="ip")(view), ratelimit(rate="2/m", key="ip")(view)
    assert first._ratelimit_declared == second._ratelimit_declared  # one count, as django-ratelimit's group
    answers = [route(rf.get("/", REMOTE_ADDR="203.0.113.9")).status_code for route in (first, second, first)]
    assert answers == [200, 200, 429]


def test_one_name_declared_twice_with_different_rates_is_refused_naming_the_view():
    def view(request):
        return None

    ratelimit(rate="2/m", key="ip", name="twice")(view)
    with pytest.raises(ImproperlyConfigured, match=r"@ratelimit on .*view: the policy 'twice' is declared here twice"):
        ratelimit(rate="5/m", key="ip", name="twice")(view)


def test_the_operator_can_disable_a_declared_policy(client, settings):
    settings.ROOT_URLCONF = "tests.code_urls"
    policy = login_policy()
    policy.enabled = False
    policy.save()
    assert [client.get("/login/").status_code for _ in range(3)] == [200, 200, 200]


# --- syncing -------------------------------------------------------------------------------------


def declare(rate: str, **fields) -> registry.CodePolicy:
    return registry.declare_policy("deployed", action="deployed", origin="test", rate=rate, key="ip", **fields)


def test_a_changed_code_rate_updates_a_row_the_operator_did_not_change():
    registry.sync([declare("5/m")])
    registry.sync([declare("50/h")])
    row = Policy.objects.get(name="deployed")
    assert (row.limit, row.window, row.code_values["limit"]) == (50, 3600, 50)
    assert registry.changed_fields(row) == []


def test_a_changed_code_rate_does_not_override_the_operators_change():
    registry.sync([declare("5/m")])
    Policy.objects.filter(name="deployed").update(limit=7, mode="shadow")
    registry.sync([declare("50/h")])
    row = Policy.objects.get(name="deployed")
    assert (row.limit, row.window, row.mode) == (7, 60, "shadow")  # the operator's rate and mode stay
    assert row.code_values["limit"] == 50 and {"limit", "mode", "window"} <= set(registry.changed_fields(row))
    registry.revert(row)
    row.refresh_from_db()
    assert (row.limit, row.window, row.mode) == (50, 3600, "enforce")


def test_a_deploy_changes_what_the_operator_left_alone():
    registry.sync([declare("5/m")])
    Policy.objects.filter(name="deployed").update(mode="shadow")
    registry.sync([declare("50/h")])
    row = Policy.objects.get(name="deployed")
    assert (row.limit, row.window, row.mode) == (50, 3600, "shadow")


def test_an_admin_policy_of_the_same_name_is_never_overwritten(caplog):
    Policy.objects.create(name="deployed", action="elsewhere", limit=9, window=60)
    registry.sync([declare("5/m")])
    row = Policy.objects.get(name="deployed")
    assert (row.source, row.limit, row.action) == ("admin", 9, "elsewhere")
    assert "the admin's policy is kept" in caplog.text


@override_settings(RATELIMIT_POLICIES=[{"name": "api-per-ip", "action": "/api/", "rate": "1/m", "key": "ip"}])
def test_settings_policies_are_written_and_enforced_by_the_middleware(client):
    assert client.get("/api/items/").status_code == 200
    assert client.get("/api/items/").status_code == 429
    row = Policy.objects.get(name="api-per-ip")
    assert (row.source, row.limit, row.window) == ("code", 1, 60)


@override_settings(RATELIMIT_POLICIES=[{"name": "bad", "action": "/api/", "rate": "1/fortnight"}, {"action": "/x/"}, "api"])
def test_bad_settings_policies_are_reported_by_the_system_checks_and_skipped():
    messages = [m.msg for m in run_checks() if m.id == "ratelimit_app.E010"]
    assert len(messages) == 3
    assert "RATELIMIT_POLICIES[0] (bad): '1/fortnight': unknown period" in messages[0]
    assert "'name' and 'action' are required" in messages[1]
    get_index()  # loads without a 500
    assert not Policy.objects.filter(name="bad").exists()


def test_import_accepts_a_rate(tmp_path):
    source = tmp_path / "policies.json"
    source.write_text(json.dumps({"format": "ratelimit_app/1", "policies": [{"name": "imp", "action": "*", "rate": "10/5m"}]}))
    call_command("ratelimit_import", str(source))
    assert Policy.objects.filter(name="imp", limit=10, window=300).exists()


def test_import_with_a_bad_rate_changes_nothing(tmp_path):
    source = tmp_path / "policies.json"
    source.write_text(json.dumps({"format": "ratelimit_app/1", "policies": [{"name": "imp", "action": "*", "rate": "10/fortnight"}]}))
    with pytest.raises(Exception, match="unknown period"):
        call_command("ratelimit_import", str(source))
    assert not Policy.objects.filter(name="imp").exists()


# --- the admin -----------------------------------------------------------------------------------


@pytest.mark.urls("tests.code_urls")
def test_admin_list_marks_policies_from_code_and_changed_ones(admin_client):
    policy = login_policy()
    Policy.objects.create(name="written-here", action="x", limit=1, window=60)
    page = admin_client.get(CHANGELIST).content.decode()
    assert '<td class="field-origin">admin</td>' in page
    assert '<td class="field-origin">code</td>' in page
    Policy.objects.filter(pk=policy.pk).update(limit=20)
    assert '<td class="field-origin">code, changed here</td>' in admin_client.get(CHANGELIST).content.decode()


@pytest.mark.urls("tests.code_urls")
def test_admin_marks_a_policy_no_longer_declared_and_lets_it_be_deleted(admin_client):
    gone = Policy.objects.create(name="gone", action="code:old.view", limit=1, window=60, source="code", code_values={})
    assert '<td class="field-origin">code, no longer in code</td>' in admin_client.get(CHANGELIST).content.decode()
    assert admin_client.get(f"{CHANGELIST}{gone.pk}/delete/").status_code == 200
    declared = login_policy()
    assert admin_client.get(f"{CHANGELIST}{declared.pk}/delete/").status_code == 403


@pytest.mark.urls("tests.code_urls")
def test_operator_changes_a_code_policy_in_the_admin_then_reverts_it(admin_client):
    policy = login_policy()
    url = f"{CHANGELIST}{policy.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert "The code declares 2/m" in page and "Revert to the code's values" in page
    response = admin_client.post(url, change_form(policy, rate="30/m", mode="shadow", action="hijacked", key="user"))
    assert response.status_code == 302, response.content.decode()[-3000:]
    policy.refresh_from_db()
    assert (policy.limit, policy.mode, policy.action, policy.key) == (30, "shadow", "code:tests.code_urls.login", "ip")
    assert "Changed here: limit 30 (code: 2), mode shadow (code: enforce)" in admin_client.get(url).content.decode()
    registry.sync()  # a deploy with the same code keeps the operator's change
    policy.refresh_from_db()
    assert policy.limit == 30

    admin_client.post(f"{CHANGELIST}{policy.pk}/revert/")
    policy.refresh_from_db()
    assert (policy.limit, policy.mode) == (2, "enforce")
    assert "This policy has the code&#x27;s values" in admin_client.get(url).content.decode()


@pytest.mark.urls("tests.code_urls")
def test_revert_action_in_the_list(admin_client):
    policy = login_policy()
    Policy.objects.filter(pk=policy.pk).update(limit=99)
    admin_client.post(CHANGELIST, {"action": "revert_to_code", "_selected_action": [policy.pk]})
    policy.refresh_from_db()
    assert policy.limit == 2


@pytest.mark.urls("tests.code_urls")
def test_revert_needs_the_change_permission(client, django_user_model):
    staff = django_user_model.objects.create_user("viewer", password="x", is_staff=True)
    client.force_login(staff)
    policy = login_policy()
    Policy.objects.filter(pk=policy.pk).update(limit=99)
    client.post(f"{CHANGELIST}{policy.pk}/revert/")
    policy.refresh_from_db()
    assert policy.limit == 99


def test_the_admin_form_takes_a_rate_string(admin_client):
    policy = Policy.objects.create(name="written-here", action="x", limit=1, window=60, key="ip", strategy="fixed_window")
    form = change_form(policy, name="written-here", action="x", key="ip", rate="100/5m")
    assert admin_client.post(f"{CHANGELIST}{policy.pk}/change/", form).status_code == 302
    policy.refresh_from_db()
    assert (policy.limit, policy.window) == (100, 300)


def test_a_bad_rate_in_the_admin_form_is_a_form_error_and_changes_nothing(admin_client):
    policy = Policy.objects.create(name="written-here", action="x", limit=1, window=60, key="ip", strategy="fixed_window")
    form = change_form(policy, name="written-here", action="x", key="ip", rate="100/fortnight")
    response = admin_client.post(f"{CHANGELIST}{policy.pk}/change/", form)
    assert response.status_code == 200
    assert "unknown period" in response.content.decode()
    policy.refresh_from_db()
    assert (policy.limit, policy.window) == (1, 60)


@pytest.mark.urls("tests.code_urls")
def test_the_live_page_lists_the_subjects_of_a_declared_policy(admin_client, client):
    client.get("/login/", REMOTE_ADDR="198.51.100.4")
    policy = Policy.objects.get(name=LOGIN_POLICY)
    data = admin_client.get(f"/admin/ratelimit_app/policy/{policy.pk}/live/?format=json").json()
    assert [(s["subject"], s["count"]) for s in data["subjects"]] == [("ip:198.51.100.4", 1)]


def test_a_urlconfs_declarations_leave_with_it_and_come_back_with_it():
    """A view module is imported once: after a reset, the views of the URLconf in use declare again,
    and those of a URLconf no longer in use do not (their policies stay out of the next tests)."""
    from django.test import override_settings

    from ratelimit_app import testing

    with override_settings(ROOT_URLCONF="tests.code_urls"):
        assert registry.declared(LOGIN_POLICY) is not None
        testing.reset()
        assert registry.declared(LOGIN_POLICY) is not None  # the URLconf in use routes to the view
        registry.sync()
        assert Policy.objects.filter(name=LOGIN_POLICY).exists()
    Policy.objects.filter(name=LOGIN_POLICY).delete()  # as the next test's rolled-back database
    testing.reset()
    assert registry.declared(LOGIN_POLICY) is None
    registry.sync()
    assert not Policy.objects.filter(name=LOGIN_POLICY).exists()


def test_a_view_no_urlconf_routes_to_declares_again_when_called_after_a_reset(rf):
    from django.http import HttpResponse

    from ratelimit_app import testing

    @ratelimit(rate="1/m", key="ip", name="called-directly")
    def view(request):
        return HttpResponse("ok")

    testing.reset()  # as between two tests: the view's module is not imported again
    assert [view(rf.get("/", REMOTE_ADDR="203.0.113.9")).status_code for _ in range(2)] == [200, 429]
