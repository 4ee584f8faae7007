"""Which override or plan assignment wins when several match a request: one rule, the same for both,
whatever order the rows were written in, and an import of an export never changes the winner."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User
from django.test import RequestFactory

from ratelimit_app.actions import plan as plan_request
from ratelimit_app.models import Override, Plan, PlanAssignment, PlanLimit
from ratelimit_app.portable import export_data, import_data
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"
KEY = "sk_live_0123456789abcdef"


@pytest.fixture
def search():
    return make_policy(name="search", action="demo:search", limit=3, window=60, key="ip")


@pytest.fixture
def alice():
    user = User.objects.create_user("alice")
    user.groups.add(Group.objects.create(name="paying"), Group.objects.create(name="trial"))
    return user


def limit_for(request, policy="search"):
    [planned] = [p for p in plan_request(request, ["demo:search"]) if p.policy.name == policy]
    return planned.limit


def request_of(user):
    request = RequestFactory().get("/demo/search/", REMOTE_ADDR=IP, HTTP_X_API_KEY=KEY)
    request.user = user or AnonymousUser()
    return request


MATCHES = {
    "key": {"kind": "header", "header": "X-Api-Key", "value": KEY},
    "user": {"kind": "user"},
    "address": {"kind": "ip", "network": IP},
    "network": {"kind": "ip", "network": "203.0.113.0/24"},
    "group paying": {"kind": "group", "group": "paying"},
    "group trial": {"kind": "group", "group": "trial"},
}


def give(via, what, limit, policy, alice):
    """A row matching `what` (a MATCHES name) giving `limit` under `policy`: an override, or a plan
    (named after the limit) that `what` is assigned to."""
    fields = dict(MATCHES[what])
    if fields["kind"] == "user":
        fields["user"] = alice
    if fields["kind"] == "group":
        fields["group"] = Group.objects.get(name=fields["group"])
    if via == "override":
        row = Override(policy=policy, limit=limit, **fields)
    else:
        plan, _ = Plan.objects.get_or_create(name=f"plan-{limit}")
        PlanLimit.objects.get_or_create(plan=plan, policy=policy, limit=limit)
        row = PlanAssignment(plan=plan, **fields)
    row.full_clean()
    row.save()


@pytest.mark.parametrize("via", ["plan", "override"])
@pytest.mark.parametrize(
    "winner, loser",
    [
        ("key", "user"),  # an API key is one credential of a user, who may hold keys on other plans
        ("user", "address"),
        ("key", "address"),
        ("user", "network"),
        ("key", "network"),
        ("address", "network"),
        ("network", "group paying"),
    ],
)
@pytest.mark.parametrize("older", ["winner", "loser"])
def test_the_narrower_subject_wins_whichever_row_is_older(search, alice, via, winner, loser, older):
    rows = [(winner, 1000), (loser, 50)]
    for what, limit in rows if older == "winner" else rows[::-1]:
        give(via, what, limit, search, alice)
    assert limit_for(request_of(alice)) == 1000


@pytest.mark.parametrize("via", ["plan", "override"])
@pytest.mark.parametrize("first", ["group paying", "group trial"])
def test_between_two_groups_the_older_row_wins(search, alice, via, first):
    second = "group trial" if first == "group paying" else "group paying"
    give(via, first, 1000, search, alice)
    give(via, second, 50, search, alice)
    assert limit_for(request_of(alice)) == 1000


def test_an_override_beats_a_plan_however_narrow_the_assignment_and_however_old(search, alice):
    give("plan", "key", 1000, search, alice)  # the narrowest subject, the older row
    give("override", "group trial", 5, search, alice)  # the broadest, written later
    assert limit_for(request_of(alice)) == 5


def test_the_review_case_an_older_key_plan_beats_a_newer_user_plan(search, alice):
    give("plan", "key", 1000, search, alice)  # enterprise, sold for the key
    give("plan", "user", 10, search, alice)  # free, given to the user later
    assert limit_for(request_of(alice)) == 1000


# --- an import does not move anyone -------------------------------------------------------------------


@pytest.fixture
def monthly():
    return make_policy(
        name="api-month", action="demo:search", strategy="calendar_quota", period="month", time_zone="UTC",
        limit=10, window=1, key="user",
    )


def two_group_plans(monthly):
    """alice in `paying` (plan pro, 100000 a month: the older assignment) and `trial` (plan alpha, 50)."""
    pro, alpha = Plan.objects.create(name="pro"), Plan.objects.create(name="alpha")
    PlanLimit.objects.create(plan=pro, policy=monthly, limit=100000)
    PlanLimit.objects.create(plan=alpha, policy=monthly, limit=50)
    PlanAssignment.objects.create(plan=pro, kind="group", group=Group.objects.get(name="paying"))
    PlanAssignment.objects.create(plan=alpha, kind="group", group=Group.objects.get(name="trial"))


def test_importing_an_unchanged_export_keeps_every_customer_on_their_plan(monthly, alice):
    two_group_plans(monthly)
    assert limit_for(request_of(alice), "api-month") == 100000
    kept = list(PlanAssignment.objects.values_list("pk", "created").order_by("pk"))
    import_data(export_data())
    assert limit_for(request_of(alice), "api-month") == 100000
    assert list(PlanAssignment.objects.values_list("pk", "created").order_by("pk")) == kept


def test_an_export_imported_where_the_plans_are_new_keeps_the_winner(monthly, alice):
    two_group_plans(monthly)
    exported = export_data()
    Plan.objects.all().delete()  # another site: the plans are created by the import
    import_data(exported)
    assert limit_for(request_of(alice), "api-month") == 100000
    assert export_data() == exported


def test_importing_unchanged_overrides_keeps_the_winner(search, alice):
    give("override", "group trial", 1000, search, alice)
    give("override", "group paying", 50, search, alice)
    kept = list(Override.objects.values_list("pk", "created").order_by("pk"))
    import_data(export_data())
    assert limit_for(request_of(alice)) == 1000
    assert list(Override.objects.values_list("pk", "created").order_by("pk")) == kept


def test_a_file_without_ages_keeps_the_rows_it_repeats_and_deletes_the_others(monthly, alice):
    two_group_plans(monthly)
    PlanAssignment.objects.create(plan=Plan.objects.get(name="pro"), kind="ip", network=IP)
    exported = export_data()
    for plan in exported["plans"]:  # as files exported before ages were written
        plan["assignments"] = [{k: v for k, v in a.items() if k != "created"} for a in plan["assignments"]]
    [pro] = [plan for plan in exported["plans"] if plan["name"] == "pro"]
    pro["assignments"] = [a for a in pro["assignments"] if a["kind"] != "ip"]
    kept = list(PlanAssignment.objects.filter(kind="group").values_list("pk", "created").order_by("pk"))
    import_data(exported)
    assert list(PlanAssignment.objects.values_list("pk", "created").order_by("pk")) == kept
    assert limit_for(request_of(alice), "api-month") == 100000


def test_an_import_deletes_thousands_of_rows_the_file_no_longer_lists(search):
    Override.objects.bulk_create(
        Override(policy=search, kind="ip", network=f"10.0.{n // 250}.{n % 250}", limit=5) for n in range(1200)
    )
    exported = export_data()
    [entry] = [policy for policy in exported["policies"] if policy["name"] == "search"]
    entry["overrides"] = entry["overrides"][600:601]
    assert import_data(exported).overrides == 1
    assert list(Override.objects.values_list("network", flat=True)) == ["10.0.2.100"]
