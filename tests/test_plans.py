"""Plans: a subject assigned to a plan gets the plan's limit on every policy the plan names, resolved
from the index like overrides (an override for the subject beats its plan), edited in the admin."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone

import ratelimit_app
from ratelimit_app.engine import version
from ratelimit_app.actions import plan as plan_request
from ratelimit_app.models import ActionCost, Override, Plan, PlanAssignment, PlanLimit
from ratelimit_app.policies import get_index
from tests.helpers import count_round_trips, in_processes, make_policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"
KEY = "sk_live_0123456789abcdef"


@pytest.fixture
def search():
    return make_policy(name="search", action="demo:search", limit=3, window=60, strategy="fixed_window", key="ip")


@pytest.fixture
def pro(search):
    plan = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=plan, policy=search, limit=10)
    return plan


def request_from(ip=IP, user=None, path="/demo/search/", **headers):
    request = RequestFactory().get(path, REMOTE_ADDR=ip, **headers)
    request.user = user or AnonymousUser()
    return request


def limits_of(request, action="demo:search"):
    """policy name -> limit in effect ('exempt' for None) for `request`."""
    return {p.policy.name: "exempt" if p.limit is None else p.limit for p in plan_request(request, [action])}


def statuses(client, times, ip=IP, **headers):
    return [client.get("/demo/search/?q=a", REMOTE_ADDR=ip, **headers).status_code for _ in range(times)]


# --- who is on a plan, and which limit wins ---------------------------------------------------------


def test_a_subject_on_a_plan_gets_the_plans_limit_on_every_policy_it_names(search, pro):
    hourly = make_policy(name="search-hourly", action="demo:search", limit=50, window=3600, key="ip")
    PlanLimit.objects.create(plan=pro, policy=hourly, limit=500)
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value=KEY)
    assert limits_of(request_from(HTTP_X_API_KEY=KEY)) == {"search": 10, "search-hourly": 500}
    assert limits_of(request_from(HTTP_X_API_KEY="another key")) == {"search": 3, "search-hourly": 50}


def test_a_policy_the_plan_does_not_name_keeps_its_own_limit(search, pro):
    make_policy(name="other", action="demo:search", limit=7, window=60, key="ip")
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    assert limits_of(request_from()) == {"search": 10, "other": 7}


def test_a_plan_may_exempt_its_subjects_from_a_policy(search):
    partners = Plan.objects.create(name="partners")
    PlanLimit.objects.create(plan=partners, policy=search, exempt=True)
    PlanAssignment.objects.create(plan=partners, kind="ip", network="203.0.113.0/24")
    assert limits_of(request_from()) == {"search": "exempt"}


def test_an_override_for_the_subject_beats_its_plan(search, pro):
    alice = User.objects.create_user("alice")
    PlanAssignment.objects.create(plan=pro, kind="user", user=alice)
    Override.objects.create(policy=search, kind="user", user=alice, limit=2)
    assert limits_of(request_from(user=alice)) == {"search": 2}


def test_a_group_override_also_beats_a_plan_assigned_to_the_user(search, pro):
    alice = User.objects.create_user("alice")
    alice.groups.add(Group.objects.create(name="staff"))
    PlanAssignment.objects.create(plan=pro, kind="user", user=alice)
    Override.objects.create(policy=search, kind="group", group=Group.objects.get(name="staff"), exempt=True)
    assert limits_of(request_from(user=alice)) == {"search": "exempt"}


def test_the_most_specific_assignment_chooses_the_plan(search, pro):
    free = Plan.objects.create(name="free")
    PlanLimit.objects.create(plan=free, policy=search, limit=1)
    alice = User.objects.create_user("alice")
    alice.groups.add(Group.objects.create(name="customers"))
    PlanAssignment.objects.create(plan=free, kind="group", group=Group.objects.get(name="customers"))
    PlanAssignment.objects.create(plan=free, kind="ip", network="203.0.113.0/24")
    PlanAssignment.objects.create(plan=pro, kind="user", user=alice)
    assert limits_of(request_from(user=alice)) == {"search": 10}  # the user's own plan before the group's
    assert limits_of(request_from(user=User.objects.create_user("bob"))) == {"search": 1}  # the network's


def test_an_expired_assignment_no_longer_applies(search, pro):
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP, expires_at=timezone.now() - timedelta(seconds=1))
    assert limits_of(request_from()) == {"search": 3}


def test_plans_are_read_from_the_index_without_queries(search, pro, django_assert_num_queries):
    alice = User.objects.create_user("alice")
    alice.groups.add(Group.objects.create(name="customers"))
    PlanAssignment.objects.create(plan=pro, kind="group", group=Group.objects.get(name="customers"))
    get_index()
    with django_assert_num_queries(0):
        assert limits_of(request_from(user=alice)) == {"search": 10}
        assert ratelimit_app.hit(request_from(user=alice), "demo:search").decisions[0].limit == 10


# --- at request time --------------------------------------------------------------------------------


def test_the_headers_carry_the_plans_limit(client, search, pro):
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value=KEY)
    response = client.get("/demo/search/?q=a", REMOTE_ADDR=IP, HTTP_X_API_KEY=KEY)
    assert response["RateLimit-Policy"] == '"search";q=10;w=60'
    assert response["RateLimit"].startswith('"search";r=9;')
    assert statuses(client, 10, HTTP_X_API_KEY=KEY) == [200] * 9 + [429]
    assert statuses(client, 4, ip="198.51.100.1") == [200] * 3 + [429]  # without the key: the policy's 3


def test_a_subject_over_its_plans_limit_is_refused_from_memory(client, search, pro):
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    assert statuses(client, 11) == [200] * 10 + [429]
    with count_round_trips() as trips:
        assert statuses(client, 5) == [429] * 5
    assert trips == [0]


def test_raising_a_plans_limit_lets_a_refused_subject_in_at_once(client, search, pro):
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    assert statuses(client, 11) == [200] * 10 + [429]
    PlanLimit.objects.filter(plan=pro).update(limit=20)
    PlanLimit.objects.get(plan=pro).save()  # through save(), as the admin does: the index reloads
    assert statuses(client, 2) == [200, 200]


def test_costs_are_counted_against_the_plans_limit(client, search, pro):
    ActionCost.objects.create(action="demo:search", cost=3)
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    response = client.get("/demo/search/?q=a", REMOTE_ADDR=IP)
    assert response["RateLimit"].startswith('"search";r=7;')
    assert statuses(client, 3) == [200, 200, 429]  # 3 + 3 + 3 = 9 of 10; 3 more would be 12


def test_a_shadow_policy_reports_the_plans_limit_and_never_denies(client, search, pro):
    search.mode = "shadow"
    search.save()
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    assert statuses(client, 12) == [200] * 12
    verdict = ratelimit_app.check(request_from(), "demo:search")
    assert (verdict.allowed, verdict.decisions[0].limit, verdict.decisions[0].exceeded) == (True, 10, True)


def _hits(start, results, attempts=20):
    start.wait()
    results.put(sum(ratelimit_app.hit(request_from(HTTP_X_API_KEY=KEY), "demo:search").allowed for _ in range(attempts)))


def test_eight_processes_hitting_one_subject_admit_exactly_the_plans_limit(search):
    search.limit = 1000
    search.save()
    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=search, limit=50)
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value=KEY)
    get_index()  # loaded before the processes fork: they decide from it, as workers do
    assert sum(in_processes(_hits)) == 50


# --- the operator's side ------------------------------------------------------------------------------


def test_the_live_page_shows_the_subjects_plan(admin_client, client, search, pro):
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    statuses(client, 4)
    live = reverse("admin:ratelimit_app_policy_live", args=[search.pk])
    [subject] = admin_client.get(live + "?format=json").json()["subjects"]
    assert (subject["count"], subject["limit"], subject["plan"], subject["blocked"]) == (4, 10, "pro", False)
    assert "pro</a>: 10 / " in admin_client.get(live).content.decode()


def test_the_tester_names_the_plan_and_where_each_limit_comes_from(admin_client, search, pro):
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value=KEY)
    page = admin_client.post(
        reverse("admin:ratelimit_app_policy_tester"),
        {"method": "GET", "path": "/demo/search/", "ip": IP, "headers": f"X-Api-Key: {KEY}"},
    ).content.decode()
    shown = page[page.index('id="rl-plan"') :]
    assert ">pro</a> (assigned to header X-Api-Key=" in shown
    assert KEY not in shown  # the key is shown masked
    assert "<td>plan pro</td>" in page and "<td>10 / 1 min</td>" in page


def test_the_cli_tester_names_the_plan(capsys, search, pro):
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    call_command("ratelimit", "test", "GET", "/demo/search/", "--ip", IP)
    out = capsys.readouterr().out
    assert "Plan: pro (assigned to ip 203.0.113.7)" in out
    assert "plan pro" in out and "10 / 1 min" in out


def test_signals_mark_the_index_stale_and_bump_the_version_on_commit(search, pro, django_capture_on_commit_callbacks):
    get_index()
    before = version.current_version()
    with django_capture_on_commit_callbacks(execute=True):
        PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    assert version.current_version() != before
    assert limits_of(request_from()) == {"search": 10}
    with django_capture_on_commit_callbacks(execute=True):
        pro.delete()
    assert limits_of(request_from()) == {"search": 3}


# --- export and import --------------------------------------------------------------------------------


def test_plans_survive_an_export_and_import_round_trip(tmp_path, capsys, search, pro):
    alice = User.objects.create_user("alice")
    Group.objects.create(name="customers")
    PlanLimit.objects.create(plan=pro, policy=make_policy(name="login", action="login", limit=5, window=60), exempt=True)
    PlanAssignment.objects.create(plan=pro, kind="user", user=alice, reason="paid")
    PlanAssignment.objects.create(plan=pro, kind="group", group=Group.objects.get(name="customers"))
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value=KEY, expires_at=timezone.now() + timedelta(days=30))
    PlanAssignment.objects.create(plan=pro, kind="ip", network="10.0.0.0/8")
    exported = tmp_path / "limits.json"
    call_command("ratelimit_export", str(exported))
    before = json.loads(exported.read_text())
    pro.delete()
    call_command("ratelimit_import", str(exported))
    assert "Imported 2 policies, 0 overrides, 0 action costs and 1 plan (4 assignments)." in capsys.readouterr().out
    again = tmp_path / "again.json"
    call_command("ratelimit_export", str(again))
    assert json.loads(again.read_text()) == before
    [entry] = before["plans"]
    assert entry["limits"] == [
        {"policy": "login", "limit": None, "exempt": True}, {"policy": "search", "limit": 10, "exempt": False}
    ]
    assert [a["kind"] for a in entry["assignments"]] == ["user", "group", "header", "ip"]
    assert limits_of(request_from(user=alice)) == {"search": 10}


def _plan_file(tmp_path, **plan) -> str:
    path = tmp_path / "plans.json"
    path.write_text(json.dumps({"format": "ratelimit_app/1", "policies": [], "plans": [{"name": "pro", **plan}]}))
    return str(path)


@pytest.mark.parametrize(
    "plan, message",
    [
        ({"limits": [{"policy": "search", "limit": -5}]}, "limit 1: field 'limit': The limit must be at least 1"),
        ({"limits": [{"policy": "search", "limit": 2**31}]}, "limit 1, field 'limit': 2147483648 is out of range"),
        ({"limits": [{"policy": "nowhere", "limit": 5}]}, "limit 1: no policy 'nowhere' here"),
        ({"limits": [{"policy": "search"}]}, "limit 1: field 'limit': Give a limit, or tick exempt."),
        ({"assignments": [{"kind": "header", "header": "X-Api-Key"}]}, "assignment 1: field 'value': Required"),
        ({"assignments": [{"kind": "ip", "network": "10.0.0.300"}]}, "assignment 1: field 'network': Enter an IP address"),
        ({"assignments": [{"kind": "user", "user": "nobody"}]}, "assignment 1: no user 'nobody' here"),
        ({"assignments": [{"kind": "ip", "network": "10.0.0.1", "created": "yesterday"}]},
         "assignment 1: field 'created': 'yesterday' is not a date and time"),
        ({"name": "not a slug"}, "field 'name'"),
    ],
)
def test_a_bad_plan_in_an_import_is_refused_with_what_is_wrong(tmp_path, search, plan, message):
    with pytest.raises(CommandError, match="Nothing was imported") as refused:
        call_command("ratelimit_import", _plan_file(tmp_path, **plan))
    assert message in str(refused.value)
    assert not Plan.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_an_async_view_gives_a_user_on_a_plan_the_plans_limit():
    from asgiref.sync import sync_to_async

    from tests.test_async import ClientAt

    def a_user_on_a_plan():
        policy = make_policy(name="quote-per-ip", action="quote", limit=2, window=60, key="ip")
        alice = User.objects.create_user("alice")
        plan = Plan.objects.create(name="pro")
        PlanLimit.objects.create(plan=plan, policy=policy, limit=5)
        PlanAssignment.objects.create(plan=plan, kind="user", user=alice)
        return alice

    client = ClientAt(IP)
    await client.aforce_login(await sync_to_async(a_user_on_a_plan)())
    assert [(await client.get("/demo/quote/")).status_code for _ in range(6)] == [200] * 5 + [429]


def test_a_bad_plan_row_written_behind_the_admins_back_is_skipped_and_logged(client, caplog, search, pro):
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    PlanLimit.objects.filter(plan=pro).update(limit=0)  # no validation on this path
    PlanAssignment.objects.create(plan=pro, kind="header", header="X-Api-Key", value="k")
    PlanAssignment.objects.filter(kind="header").update(value="")
    with caplog.at_level("ERROR", logger="ratelimit_app"):
        assert statuses(client, 4) == [200, 200, 200, 429]  # the policy's own 3
    assert "limit id" in caplog.text and "of plan 'pro' is invalid and is skipped" in caplog.text
    assert "to plan 'pro' is invalid and is skipped" in caplog.text


def test_the_compat_decorators_policies_give_a_subject_on_a_plan_the_plans_limit():
    from ratelimit_app.compat.django_ratelimit import get_usage

    def usage(ip=IP):
        request = RequestFactory().get("/", REMOTE_ADDR=ip)
        return get_usage(request, group="search", key="ip", rate="2/m", increment=True)["should_limit"]

    usage("198.51.100.1")  # writes the code's policy into the admin
    from ratelimit_app.models import Policy

    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=Policy.objects.get(name="rl-search-2-m-ip"), limit=4)
    PlanAssignment.objects.create(plan=pro, kind="ip", network=IP)
    assert [usage() for _ in range(5)] == [False] * 4 + [True]
    assert [usage("198.51.100.1") for _ in range(2)] == [False, True]
