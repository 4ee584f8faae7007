"""Which override or plan assignment wins when several match a request: one rule, the same for both,
whatever order the rows were written in."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User
from django.test import RequestFactory

from ratelimit_app.actions import plan as plan_request
from ratelimit_app.models import Override, Plan, PlanAssignment, PlanLimit
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
