"""The policy admin: list, form errors on their fields, bulk actions, overrides, tester, changes."""

from __future__ import annotations

from functools import partial

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from ratelimit_app import engine
from ratelimit_app.engine import version
from ratelimit_app.models import Override, Policy
from ratelimit_app.policies import compile_policy
from tests.helpers import check, make_policy

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/ratelimit_app/policy/"
FORM = {
    "name": "search-per-ip", "action": "demo:search", "limit": "100", "window": "60", "strategy": "fixed_window",
    "key": "ip", "methods": "", "mode": "enforce", "enabled": "on", "bucket_size": "", "description": "",
    "overrides-TOTAL_FORMS": "0", "overrides-INITIAL_FORMS": "0", "overrides-MIN_NUM_FORMS": "0",
    "overrides-MAX_NUM_FORMS": "1000",
}


make = partial(make_policy, name="search-per-ip", action="demo:search", limit=100)


def test_list_shows_human_windows_and_active_subjects(admin_client):
    policy = make(window=3600)
    for i in range(3):
        engine.decide([check(compile_policy(policy), f"ip:198.51.100.{i}")])
    page = admin_client.get(CHANGELIST).content.decode()
    assert "100 / 1 h" in page
    assert '<td class="field-active_now">3</td>' in page
    assert '<td class="field-denied_now">0</td>' in page
    assert reverse("admin:ratelimit_app_policy_live", args=[policy.pk]) in page


def test_list_shows_what_a_shadow_policy_would_have_denied(admin_client):
    policy = make(limit=1, mode="shadow")
    for _ in range(3):
        engine.decide([check(compile_policy(policy))])
    assert '<td class="field-denied_now">2 (would)</td>' in admin_client.get(CHANGELIST).content.decode()


def test_list_filters_and_search(admin_client):
    make(name="a-shadow", mode="shadow")
    make(name="b-enforced")
    shadow_only = admin_client.get(CHANGELIST + "?mode__exact=shadow").content.decode()
    assert "a-shadow" in shadow_only and "b-enforced" not in shadow_only
    found = admin_client.get(CHANGELIST + "?q=b-enf").content.decode()
    assert "b-enforced" in found and "a-shadow" not in found


def test_add_form_creates_a_policy(admin_client):
    response = admin_client.post(CHANGELIST + "add/", FORM)
    assert response.status_code == 302
    assert Policy.objects.get(name="search-per-ip").limit == 100


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("limit", "0", "at least 1 request"),
        ("window", "-5", "greater than or equal to 0"),
        ("key", "usr", "Unknown key kind"),
        ("methods", "GET,FETCH", "Unknown HTTP method"),
        ("action", "two words", "cannot be empty or contain spaces"),
        ("strategy", "leaky_bucket", "is not a strategy of this site"),
    ],
)
def test_bad_values_are_refused_with_a_message_on_the_field(admin_client, field, value, message):
    response = admin_client.post(CHANGELIST + "add/", {**FORM, field: value})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors[field])
    assert not Policy.objects.exists()


def test_bucket_size_that_does_not_divide_the_window_is_refused_on_its_field(admin_client):
    response = admin_client.post(CHANGELIST + "add/", {**FORM, "strategy": "sliding_window", "bucket_size": "7"})
    assert "must divide the window" in " ".join(response.context["adminform"].form.errors["bucket_size"])


def test_the_unit_field_offers_the_usual_units_and_is_requests_when_left_blank(admin_client):
    page = admin_client.get(CHANGELIST + "add/").content.decode()
    assert 'list="rl-units"' in page and 'value="requests"' in page  # a new policy counts requests unless told
    for unit in ("requests", "content-bytes", "tokens", "credits"):
        assert f'<option value="{unit}">' in page
    assert admin_client.post(CHANGELIST + "add/", {**FORM, "unit": ""}).status_code == 302
    assert Policy.objects.get(name="search-per-ip").unit == "requests"


def test_a_named_unit_is_saved_and_the_list_shows_limits_in_it(admin_client):
    response = admin_client.post(CHANGELIST + "add/", {**FORM, "limit": "20000", "unit": "tokens"})
    assert response.status_code == 302 and Policy.objects.get(name="search-per-ip").unit == "tokens"
    make(name="month", limit=10_000_000, strategy="calendar_quota", period="month", unit="tokens")
    make(name="bytes", limit=5_000_000, window=3600, strategy="token_bucket", burst=1_000_000, unit="content-bytes")
    page = admin_client.get(CHANGELIST).content.decode()
    assert "20,000 tokens / 1 min" in page
    assert "10,000,000 tokens / calendar month (UTC)" in page
    assert "5,000,000 content-bytes / 1 h, burst 1,000,000" in page
    assert admin_client.get(CHANGELIST + "?unit__exact=tokens").context["cl"].result_count == 2


def test_a_policy_declared_in_code_in_tokens_says_so_where_it_shows_the_codes_values(admin_client):
    values = {"action": "chat", "limit": 20000, "window": 60, "strategy": "fixed_window", "key": "ip",
              "methods": "", "mode": "enforce", "unit": "tokens"}
    policy = Policy.objects.create(name="chat-tokens", source="code", code_values=values, **values)
    page = admin_client.get(f"{CHANGELIST}{policy.pk}/change/").content.decode()
    assert "The code declares 20000/m tokens, fixed_window, per ip, enforce" in page


def test_a_unit_the_strategy_cannot_count_is_refused_on_the_unit_field_with_the_reason(admin_client):
    response = admin_client.post(CHANGELIST + "add/", {**FORM, "strategy": "sliding_log", "unit": "tokens"})
    assert response.status_code == 200
    said = " ".join(response.context["adminform"].form.errors["unit"])
    assert "sliding_log cannot count tokens: it keeps one entry per unit" in said
    response = admin_client.post(CHANGELIST + "add/", {**FORM, "unit": "Tokens!"})
    assert "A unit is 'requests', 'content-bytes'" in " ".join(response.context["adminform"].form.errors["unit"])
    assert not Policy.objects.exists()


def test_bulk_actions_change_policies_through_save(admin_client):
    policy = make()
    admin_client.post(CHANGELIST, {"action": "disable", "_selected_action": [policy.pk]})
    assert not Policy.objects.get(pk=policy.pk).enabled
    admin_client.post(CHANGELIST, {"action": "make_shadow", "_selected_action": [policy.pk]})
    assert Policy.objects.get(pk=policy.pk).mode == "shadow"
    admin_client.post(CHANGELIST, {"action": "reset_counts", "_selected_action": [policy.pk]})
    assert Policy.objects.get(pk=policy.pk).generation == 1


def test_bulk_actions_count_what_they_changed_even_in_a_filtered_list(admin_client):
    policies = [make(name=f"p{i}") for i in range(3)]
    response = admin_client.post(
        CHANGELIST + "?enabled__exact=1",
        {"action": "disable", "_selected_action": [p.pk for p in policies]},
        follow=True,
    )
    assert "Disabled 3 policies." in [str(m) for m in response.context["messages"]]
    admin_client.post(CHANGELIST, {"action": "enable", "_selected_action": [policies[0].pk]})
    assert list(Policy.objects.filter(enabled=True)) == [policies[0]]


def test_bulk_actions_are_announced_to_every_worker_and_logged(admin_client, django_capture_on_commit_callbacks):
    policy = make(mode="shadow")
    before = version.read_version()
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(CHANGELIST, {"action": "make_enforce", "_selected_action": [policy.pk]})
    assert Policy.objects.get(pk=policy.pk).mode == "enforce"
    assert version.read_version() > before
    changes = admin_client.get(reverse("admin:ratelimit_app_policy_changes")).content.decode()
    assert "Changed mode." in changes


def test_mode_and_enabled_are_editable_in_the_list(admin_client):
    policy = make()
    assert '<option value="shadow">shadow</option>' in admin_client.get(CHANGELIST).content.decode()  # short, fits
    admin_client.post(CHANGELIST, {
        "form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-MIN_NUM_FORMS": "0", "form-MAX_NUM_FORMS": "1000",
        "form-0-id": str(policy.pk), "form-0-mode": "shadow", "_save": "Save",  # enabled unticked
    })
    policy.refresh_from_db()
    assert (policy.mode, policy.enabled) == ("shadow", False)


def test_view_only_staff_see_the_list_without_actions_or_editable_fields(client):
    make()
    staff = User.objects.create_user("viewer", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_policy"))
    client.force_login(staff)
    page = client.get(CHANGELIST).content.decode()
    assert "search-per-ip" in page
    assert 'name="action"' not in page and 'name="form-0-enabled"' not in page


def test_reset_counts_action_starts_every_subject_afresh(admin_client):
    policy = make(limit=1)
    engine.decide([check(compile_policy(policy))])
    assert not engine.decide([check(compile_policy(policy))]).allowed
    admin_client.post(CHANGELIST, {"action": "reset_counts", "_selected_action": [policy.pk]})
    assert engine.decide([check(compile_policy(Policy.objects.get(pk=policy.pk)))]).allowed


def test_change_page_links_to_the_live_page(admin_client):
    policy = make()
    page = admin_client.get(CHANGELIST + f"{policy.pk}/change/").content.decode()
    assert reverse("admin:ratelimit_app_policy_live", args=[policy.pk]) in page


def test_overrides_are_edited_inline_and_listed(admin_client):
    policy = make()
    form = {**FORM, "overrides-TOTAL_FORMS": "1", "overrides-0-kind": "ip", "overrides-0-network": "10.0.0.0/8",
            "overrides-0-exempt": "on", "overrides-0-reason": "office"}
    response = admin_client.post(CHANGELIST + f"{policy.pk}/change/", form)
    assert response.status_code == 302
    assert Override.objects.get(policy=policy).network == "10.0.0.0/8"
    assert "ip 10.0.0.0/8" in admin_client.get("/admin/ratelimit_app/override/").content.decode()


def test_tester_shows_matches_subjects_and_overrides_without_counting(admin_client):
    policy = make(limit=2, action="/demo/")
    Override.objects.create(policy=policy, kind="ip", network="203.0.113.0/24", limit=50)
    make(name="per-user", action="*", key="user")
    data = {"method": "GET", "path": "/demo/search/", "username": "", "ip": "203.0.113.7", "headers": ""}
    for _ in range(3):
        page = admin_client.post(reverse("admin:ratelimit_app_policy_tester"), data).content.decode()
    assert "ip:203.0.113.7" in page
    assert "ip 203.0.113.0/24" in page and "50 / 1 min" in page  # the window as the list and the CLI say it
    assert "allow, 50 left" in page  # three tests counted nothing
    assert "does not apply" in page  # the per-user policy on an anonymous request


def test_tester_speaks_in_each_policys_unit_and_says_the_cost_is_an_estimate_for_metered_ones(admin_client):
    tokens = make(name="chat-tokens", action="/demo/", limit=20_000, unit="tokens")
    engine.decide([check(compile_policy(tokens))], cost=1834)
    make(name="per-ip", action="*", limit=100)
    data = {"method": "GET", "path": "/demo/search/", "username": "", "ip": "203.0.113.7", "headers": ""}
    page = admin_client.post(reverse("admin:ratelimit_app_policy_tester"), data).content.decode()
    assert "<td>20,000 tokens / 1 min</td>" in page and "<td>1,834</td>" in page
    assert "allow, 18,166 tokens left" in page
    assert "<td>100 / 1 min</td>" in page and "allow, 100 left" in page  # requests stay as they were written
    assert "The cost is the estimate the policies in tokens admit the request on" in page


def test_tester_refuses_bad_input_with_messages(admin_client):
    data = {"method": "GET", "path": "demo", "username": "nobody", "ip": "300.1.1.1", "headers": "no colon"}
    form = admin_client.post(reverse("admin:ratelimit_app_policy_tester"), data).context["form"]
    assert set(form.errors) == {"path", "username", "ip", "headers"}


def test_changes_page_lists_who_changed_what(admin_client, admin_user):
    admin_client.post(CHANGELIST + "add/", FORM)
    page = admin_client.get(reverse("admin:ratelimit_app_policy_changes")).content.decode()
    assert admin_user.username in page and "search-per-ip" in page and "added" in page


def test_staff_without_view_permission_cannot_open_the_tester(client):
    staff = User.objects.create_user("staff", is_staff=True)
    client.force_login(staff)
    assert client.get(reverse("admin:ratelimit_app_policy_tester")).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_policy"))
    assert client.get(reverse("admin:ratelimit_app_policy_tester")).status_code == 200


@pytest.mark.parametrize("window, bucket", [("60", "60"), ("1", "1"), ("10", "0")])
def test_a_bucket_over_half_the_window_is_refused_with_the_reason(admin_client, window, bucket):
    response = admin_client.post(CHANGELIST + "add/", {**FORM, "strategy": "sliding_window", "window": window, "bucket_size": bucket})
    errors = " ".join(response.context["adminform"].form.errors["bucket_size"])
    assert ("at most half the window" in errors) if bucket != "0" else ("at least 1 second" in errors)
    assert not Policy.objects.exists()
