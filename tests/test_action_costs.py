"""Action costs as data: a request of a priced action takes N units of every policy that applies. A
cost no enforcing policy can admit is refused where it is declared; the index, the tester, export and
import carry the costs."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpResponse
from django.urls import path, reverse
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app import policies
from ratelimit_app.models import ActionCost, Policy
from ratelimit_app.policies import PolicyIndex, get_index
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

NEVER = "A request of 'search' costs 10 units, more than policy 'x' allows at once (5): it could never be admitted."


def price(action: str = "search", cost: int = 10, **fields) -> ActionCost:
    row = ActionCost(action=action, cost=cost, **fields)
    row.full_clean()
    row.save()
    return row


# --- the model: a cost that can never fit is refused where it is declared ------------------------


@pytest.mark.parametrize("cost", [0, 2**31])
def test_a_cost_below_one_or_beyond_an_integer_column_is_refused(cost):
    with pytest.raises(ValidationError) as refused:
        ActionCost(action="search", cost=cost).full_clean()
    assert set(refused.value.message_dict) == {"cost"}


def test_a_cost_above_an_enforcing_policys_limit_is_refused_naming_the_policy():
    make_policy(name="x", action="search", limit=5)
    with pytest.raises(ValidationError) as refused:
        ActionCost(action="search", cost=10).full_clean()
    assert refused.value.message_dict == {"cost": [NEVER]}


def test_a_token_buckets_burst_is_what_it_admits_at_once():
    make_policy(name="x", action="search", limit=50, strategy="token_bucket", burst=5)
    with pytest.raises(ValidationError, match=r"allows at once \(5\)"):
        ActionCost(action="search", cost=10).full_clean()
    price(cost=5)


@pytest.mark.parametrize("action", ["*", "search"])
def test_a_policy_on_every_request_or_the_same_action_blocks_a_cost_it_cannot_admit(action):
    make_policy(name="x", action=action, limit=5)
    with pytest.raises(ValidationError, match="could never be admitted"):
        ActionCost(action="search", cost=10).full_clean()


@pytest.mark.parametrize("fields", [{"mode": "shadow"}, {"enabled": False}, {"action": "login"}])
def test_a_shadow_disabled_or_unrelated_policy_does_not_block_a_cost(fields):
    make_policy(**{"name": "x", "action": "search", "limit": 5, **fields})
    assert price(cost=10).cost == 10


def test_nested_path_prefixes_meet_each_other():
    make_policy(name="x", action="/api/v1/", limit=5)
    with pytest.raises(ValidationError, match="could never be admitted"):
        ActionCost(action="/api/", cost=10).full_clean()
    assert price(action="/static/", cost=10).cost == 10


def test_a_policy_whose_limit_is_below_its_actions_cost_is_refused_on_the_limit():
    price(cost=10)
    with pytest.raises(ValidationError) as refused:
        Policy(name="x", action="search", limit=5, window=60).full_clean()
    assert refused.value.message_dict["limit"][0].startswith(NEVER)
    assert "Raise the limit to at least 10" in refused.value.message_dict["limit"][0]
    Policy(name="x", action="search", limit=5, window=60, mode="shadow").full_clean()  # never denies


def test_a_token_bucket_whose_burst_is_below_the_cost_is_refused_on_the_burst():
    price(cost=10)
    with pytest.raises(ValidationError) as refused:
        Policy(name="x", action="search", limit=50, window=60, strategy="token_bucket", burst=5).full_clean()
    assert set(refused.value.message_dict) == {"burst"}
    assert "Raise the burst to at least 10" in refused.value.message_dict["burst"][0]


# --- the admin --------------------------------------------------------------------------------

COSTS = "/admin/ratelimit_app/actioncost/"


def test_the_admin_adds_lists_and_searches_costs(admin_client):
    response = admin_client.post(COSTS + "add/", {"action": "search", "cost": "5", "note": "one search = 5 queries"})
    assert response.status_code == 302
    assert ActionCost.objects.get(action="search").cost == 5
    price(action="export", cost=50)
    found = admin_client.get(COSTS + "?q=sear").content.decode()
    assert "one search = 5 queries" in found and "export" not in found


def test_the_admin_cost_form_shows_why_a_cost_could_never_be_admitted(admin_client):
    make_policy(name="x", action="search", limit=5)
    response = admin_client.post(COSTS + "add/", {"action": "search", "cost": "10", "note": ""})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {"cost": [NEVER]}
    assert not ActionCost.objects.exists()


def test_the_admin_policy_form_shows_the_cost_on_the_limit(admin_client):
    from tests.test_admin import CHANGELIST, FORM

    price(action="demo:search", cost=200)
    response = admin_client.post(CHANGELIST + "add/", FORM)  # 100 per minute
    assert response.status_code == 200
    assert "costs 200 units" in " ".join(response.context["adminform"].form.errors["limit"])


def test_switching_a_policy_to_enforce_from_the_list_meets_the_cost_too(admin_client):
    from tests.test_admin import CHANGELIST

    policy = make_policy(name="x", action="search", limit=5, mode="shadow")
    price(cost=10)
    form = {
        "form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-MIN_NUM_FORMS": "0", "form-MAX_NUM_FORMS": "1000",
        "form-0-id": str(policy.pk), "form-0-mode": "enforce", "form-0-enabled": "on", "_save": "Save",
    }
    page = admin_client.post(CHANGELIST, form).content.decode()
    assert "could never be admitted" in page
    assert Policy.objects.get(pk=policy.pk).mode == "shadow"


def test_the_enforce_action_skips_a_policy_that_could_never_admit_a_cost(admin_client):
    from tests.test_admin import CHANGELIST

    blocked = make_policy(name="x", action="search", limit=5, mode="shadow")
    free = make_policy(name="y", action="login", limit=5, mode="shadow")
    price(cost=10)
    page = admin_client.post(CHANGELIST, {"action": "make_enforce", "_selected_action": [blocked.pk, free.pk]}, follow=True)
    said = [str(message) for message in page.context["messages"]]
    assert any(m.startswith("x was not changed: A request of 'search' costs 10 units") for m in said), said
    assert dict(Policy.objects.values_list("name", "mode")) == {"x": "shadow", "y": "enforce"}


# --- the index --------------------------------------------------------------------------------


INDEX = PolicyIndex((), costs={"search": 5, "/api/": 3, "/api/export/": 40, "*": 2})


@pytest.mark.parametrize(
    "path, names, cost",
    [
        ("/demo/", ["demo:search", None], 2),  # only '*'
        ("/demo/", ["search"], 5),  # by name
        ("/api/items/", [], 3),  # by path prefix
        ("/api/export/all/", ["search"], 40),  # the largest wins
    ],
)
def test_cost_of_is_the_largest_cost_the_request_meets(path, names, cost):
    assert INDEX.cost_of(path=path, names=names) == cost


def test_cost_of_is_none_when_no_cost_matches():
    assert PolicyIndex((), costs={"search": 5, "/api/": 3}).cost_of(path="/demo/", names=["login"]) is None
    assert PolicyIndex(()).cost_of(path="/", names=["search"]) is None


def test_a_cost_without_a_policy_charges_nothing():
    assert not PolicyIndex((), costs={"*": 5})


def test_a_saved_cost_reaches_the_index_and_a_deleted_one_leaves_it():
    assert get_index().cost_of(path="/demo/search/", names=["demo:search"]) is None
    cost = price(action="demo:search", cost=4)
    assert get_index().cost_of(path="/demo/search/", names=["demo:search"]) == 4
    cost.cost = 6
    cost.save()
    assert get_index().cost_of(path="/demo/search/", names=["demo:search"]) == 6
    cost.delete()
    assert get_index().cost_of(path="/demo/search/", names=["demo:search"]) is None


def test_an_invalid_cost_row_is_skipped_with_a_logged_error(caplog):
    ActionCost.objects.bulk_create([ActionCost(action="has space", cost=2), ActionCost(action="search", cost=3)])
    policies.forget_index()  # bulk_create sends no signal
    with caplog.at_level(logging.ERROR, logger="ratelimit_app"):
        index = get_index()
    assert index.costs == {"search": 3}
    assert "action cost 'has space'" in caplog.text


# --- export and import ------------------------------------------------------------------------

POLICY = {"name": "search-per-ip", "action": "search", "limit": 100, "window": 60, "strategy": "fixed_window", "key": "ip"}


def export() -> dict:
    out = StringIO()
    call_command("ratelimit_export", stdout=out)
    return json.loads(out.getvalue())


def run_import(tmp_path, data) -> str:
    source = tmp_path / "policies.json"
    source.write_text(json.dumps(data))
    out = StringIO()
    call_command("ratelimit_import", str(source), stdout=out)
    return out.getvalue()


def test_costs_round_trip_through_export_and_import(tmp_path):
    make_policy(**POLICY)
    price(action="search", cost=5, note="one search = 5 queries")
    price(action="/api/export/", cost=20)
    exported = export()
    assert exported["costs"] == [
        {"action": "/api/export/", "cost": 20, "note": ""},
        {"action": "search", "cost": 5, "note": "one search = 5 queries"},
    ]
    ActionCost.objects.all().delete()
    assert "and 2 action costs." in run_import(tmp_path, exported)
    assert export() == exported


def test_an_import_updates_a_cost_by_its_action(tmp_path):
    price(action="search", cost=5, note="old")
    run_import(tmp_path, {"format": "ratelimit_app/1", "policies": [], "costs": [{"action": "search", "cost": 7}]})
    assert ActionCost.objects.values_list("action", "cost", "note").get() == ("search", 7, "old")


def test_a_file_without_costs_still_imports(tmp_path):
    price(action="search", cost=5)
    assert "Imported 1 policy, 0 overrides and 0 action costs." in run_import(
        tmp_path, {"format": "ratelimit_app/1", "policies": [POLICY]}
    )
    assert ActionCost.objects.get().cost == 5


def test_a_file_may_raise_a_limit_and_a_cost_together(tmp_path):
    make_policy(**{**POLICY, "limit": 5})
    run_import(tmp_path, {"format": "ratelimit_app/1", "policies": [{**POLICY, "limit": 10}], "costs": [{"action": "search", "cost": 10}]})
    assert (Policy.objects.get().limit, ActionCost.objects.get().cost) == (10, 10)


@pytest.mark.parametrize(
    "costs, message",
    [
        ([{"action": "search", "cost": 0}], "cost 1 ('search'): field 'cost'"),
        ([{"action": "search", "cost": 500}], "cost 1 ('search'): field 'cost': A request of 'search' costs 500 units"),
        ([{"action": "search", "cost": "5"}], "cost 1 ('search'), field 'cost': expected a whole number, got the text '5'"),
        ([{"action": "search", "cost": 2.5}], "field 'cost': expected a whole number"),
        ([{"action": "search", "cost": 2, "colour": "red"}], "cost 1 ('search'), field 'colour': unknown field"),
        ([{"cost": 2}], "cost 1, field 'action': required"),
        ([{"action": "search", "cost": 2}, {"action": "search", "cost": 3}], "cost 2 ('search'), field 'action': the action is already priced by cost 1"),
        ([{"action": "has space", "cost": 2}], "field 'action'"),
        ({"search": 2}, "field 'costs': expected a list, got an object"),
        (["search"], "cost 1: expected an object"),
    ],
)
def test_a_bad_cost_is_refused_and_nothing_is_imported(tmp_path, costs, message):
    with pytest.raises(CommandError, match="Nothing was imported") as refused:
        run_import(tmp_path, {"format": "ratelimit_app/1", "policies": [POLICY], "costs": costs})
    assert message in str(refused.value)
    assert not Policy.objects.exists() and not ActionCost.objects.exists()


# --- the tester -------------------------------------------------------------------------------


def explained(client, path: str) -> str:
    data = {"method": "GET", "path": path, "username": "", "ip": "203.0.113.7", "headers": ""}
    return client.post(reverse("admin:ratelimit_app_policy_tester"), data).content.decode()


def test_the_tester_says_an_ordinary_request_costs_one_unit(admin_client):
    make_policy(name="x", action="demo:search", limit=5)
    assert "Cost: 1 unit" in explained(admin_client, "/demo/search/")


def test_the_tester_shows_the_admin_cost_and_its_action(admin_client):
    make_policy(name="x", action="demo:search", limit=5)
    price(action="demo:search", cost=4)
    price(action="*", cost=2)
    page = explained(admin_client, "/demo/search/")
    assert "Cost: 4 units (admin action cost &#x27;demo:search&#x27;)" in page
    assert "allow, 5 left" in page  # the dry run counted nothing


def test_the_cli_tester_prints_the_cost():
    make_policy(name="x", action="demo:search", limit=5)
    price(action="demo:search", cost=4)
    out = StringIO()
    call_command("ratelimit", "test", "GET", "/demo/search/", stdout=out)
    assert "Cost: 4 units (admin action cost 'demo:search')" in out.getvalue()


# the views' own costs, as the engine side of the decorator and the DRF throttle declare them


def priced_view(request):
    return HttpResponse("ok")


priced_view.ratelimit_cost = 2


def computed_view(request):
    return HttpResponse("ok")


computed_view.ratelimit_cost = lambda request: 3


class PricedApi(APIView):
    throttle_cost = 3

    def get(self, request):
        return Response({})


class ComputedApi(APIView):
    def get_throttle_cost(self, request):
        return 4

    def get(self, request):
        return Response({})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("priced/", priced_view, name="priced"),
    path("computed/", computed_view, name="computed"),
    path("api/priced/", PricedApi.as_view(), name="api-priced"),
    path("api/computed/", ComputedApi.as_view(), name="api-computed"),
]


@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    "path, shown",
    [
        ("/priced/", "Cost: 2 units (from the view&#x27;s code)"),
        ("/computed/", "Cost: computed per request by the view&#x27;s code"),
        ("/api/priced/", "Cost: 3 units (from the view&#x27;s code)"),
        ("/api/computed/", "Cost: computed per request by the view&#x27;s code"),
    ],
)
def test_the_tester_shows_the_cost_the_views_code_declares(admin_client, path, shown):
    assert shown in explained(admin_client, path)


@pytest.mark.urls(__name__)
def test_the_tester_says_the_admin_cost_overrides_the_codes(admin_client):
    price(action="priced", cost=4)
    price(action="computed", cost=5)
    assert "Cost: 4 units (admin action cost &#x27;priced&#x27;; overrides the code&#x27;s 2)" in explained(admin_client, "/priced/")
    assert "overrides the code&#x27;s cost computed per request" in explained(admin_client, "/computed/")


def test_a_cost_beside_a_metered_policy_is_not_refused_by_a_policy_counting_requests():
    # a request meeting the tokens policy takes one request from the other: its cost never blocks it
    make_policy(name="chat-requests", action="chat", limit=3, window=60)
    make_policy(name="chat-tokens", action="chat", limit=20_000, window=60, unit="tokens")
    price("chat", 1008)
    make_policy(name="chat-per-user", action="chat", limit=5, window=60, key="user")  # and after the cost too
