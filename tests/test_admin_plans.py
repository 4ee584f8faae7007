"""Plans in the admin: one page with the plan's limits and its assignments, clear errors for bad input,
and a change reaching running workers through the policy version."""

from __future__ import annotations

import textwrap
import time

import pytest
from django.urls import reverse

from ratelimit_app.models import Plan, PlanAssignment, PlanLimit
from ratelimit_app.policies import get_index
from tests.helpers import make_policy
from tests.servers import Server, fetch, manage, site_env

IP = "203.0.113.7"
ADD = "/admin/ratelimit_app/plan/add/"


def plan_form(policy_id, limit="10", exempt=False, **assignment) -> dict[str, str]:
    """The add form as the browser posts it: one limit row and one assignment row."""
    data = {
        "name": "pro", "description": "",
        "limits-TOTAL_FORMS": "1", "limits-INITIAL_FORMS": "0", "limits-MIN_NUM_FORMS": "0", "limits-MAX_NUM_FORMS": "1000",
        "limits-0-policy": str(policy_id), "limits-0-limit": limit,
        "assignments-TOTAL_FORMS": "1", "assignments-INITIAL_FORMS": "0",
        "assignments-MIN_NUM_FORMS": "0", "assignments-MAX_NUM_FORMS": "1000",
    }
    if exempt:
        data["limits-0-exempt"] = "on"
    for field, value in {"kind": "ip", "network": IP, **assignment}.items():
        data[f"assignments-0-{field}"] = value
    return data


@pytest.fixture
def search(db):
    return make_policy(name="search", action="demo:search", limit=3, window=60, strategy="fixed_window", key="ip")


def test_a_plan_saved_in_the_admin_limits_its_subjects_at_once(admin_client, client, search):
    response = admin_client.post(ADD, plan_form(search.pk, "10"))
    assert response.status_code == 302, response.content.decode()[:2000]
    plan = Plan.objects.get(name="pro")
    assert [(row.policy_id, row.limit) for row in plan.limits.all()] == [(search.pk, 10)]
    got = client.get("/demo/search/?q=a", REMOTE_ADDR=IP)
    assert got["RateLimit-Policy"] == '"search";q=10;w=60'


def test_the_plan_list_shows_its_limits_and_how_many_are_on_it(admin_client, search):
    assert admin_client.post(ADD, plan_form(search.pk, "10")).status_code == 302
    page = admin_client.get(reverse("admin:ratelimit_app_plan_changelist")).content.decode()
    assert "search: 10" in page


@pytest.mark.parametrize(
    "limit, exempt, assignment, message",
    [
        ("-5", False, {}, "The limit must be at least 1 request per window."),
        ("0", False, {}, "The limit must be at least 1 request per window."),
        (str(2**31), False, {}, "The limit can be at most 2147483647 per window."),
        ("", False, {}, "Give a limit, or tick exempt."),
        ("10", True, {}, "An exempt plan limit has no limit"),
        ("10", False, {"kind": "header", "header": "X-Api-Key", "network": ""}, "Required when it matches a header value."),
        ("10", False, {"kind": "header", "header": "X Api Key", "value": "k", "network": ""}, "is not an HTTP header name"),
        ("10", False, {"network": "10.0.0.300"}, "Enter an IP address or a network in CIDR form"),
        ("10", False, {"kind": "user", "network": ""}, "Required when it matches by user."),
        # a user or group that does not exist (deleted meanwhile, or an id typed in): matches nothing
        ("10", False, {"kind": "user", "user": "99999", "network": ""}, "Select a valid choice."),
        ("10", False, {"kind": "group", "group": "99999", "network": ""}, "Select a valid choice."),
    ],
)
def test_bad_plans_are_refused_with_a_message_and_nothing_is_saved(admin_client, search, limit, exempt, assignment, message):
    response = admin_client.post(ADD, plan_form(search.pk, limit, exempt, **assignment))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Plan.objects.exists() and not PlanLimit.objects.exists() and not PlanAssignment.objects.exists()


def test_a_plan_names_each_policy_once(admin_client, search):
    data = plan_form(search.pk, "10")
    data.update({"limits-TOTAL_FORMS": "2", "limits-1-policy": str(search.pk), "limits-1-limit": "20"})
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "Please correct the duplicate data for policy" in response.content.decode()
    assert not Plan.objects.exists()


def test_the_change_page_edits_a_plans_limit_for_the_next_request(admin_client, client, search):
    assert admin_client.post(ADD, plan_form(search.pk, "10")).status_code == 302
    plan = Plan.objects.get()
    limit, assignment = plan.limits.get(), plan.assignments.get()
    get_index()
    data = plan_form(search.pk, "20")
    data.update({
        "limits-INITIAL_FORMS": "1", "limits-0-id": str(limit.pk), "limits-0-plan": str(plan.pk),
        "assignments-INITIAL_FORMS": "1", "assignments-0-id": str(assignment.pk), "assignments-0-plan": str(plan.pk),
    })
    assert admin_client.post(reverse("admin:ratelimit_app_plan_change", args=[plan.pk]), data).status_code == 302
    assert client.get("/demo/search/?q=a", REMOTE_ADDR=IP)["RateLimit-Policy"] == '"search";q=20;w=60'


# --- a running worker in another process ----------------------------------------------------------

ADMIN_POST = textwrap.dedent(
    """
    from django.contrib.auth.models import User
    from django.test import Client
    from ratelimit_app.models import Policy
    admin = User.objects.create_superuser("boss", "boss@example.com", "x")
    client = Client()
    client.force_login(admin)
    policy = Policy.objects.get(name="search")
    data = {DATA}
    data["limits-0-policy"] = str(policy.pk)
    response = client.post("/admin/ratelimit_app/plan/add/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    print("saved")
    """
)


@pytest.mark.slow
def test_a_plan_saved_in_the_admin_reaches_a_running_worker(tmp_path):
    """Two worker processes with the index loaded; the admin POST happens in a third, and the workers
    hear of it through the policy version (their periodic reload is a day away)."""
    env = site_env(tmp_path / "site.sqlite3", DJANGO_SETTINGS_MODULE="tests.propagation_settings")
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", "from ratelimit_app.models import Policy\n"
           "Policy.objects.create(name='search', action='demo:search', limit=1000, window=60, strategy='fixed_window', key='ip')")
    servers = [Server(env), Server(env)]
    try:
        url = "/demo/search/?q=a"
        for server in servers:
            assert fetch(server.url + url)[1]["RateLimit-Policy"] == '"search";q=1000;w=60'
        data = {k: v for k, v in plan_form(0, "5", network="127.0.0.1").items() if k != "limits-0-policy"}
        assert "saved" in manage(env, "shell", "-c", ADMIN_POST.replace("{DATA}", repr(data)))
        for number, server in enumerate(servers, 1):
            polls = 0
            while fetch(server.url + url)[1]["RateLimit-Policy"] != '"search";q=5;w=60':
                polls += 1
                time.sleep(0.01)
                assert polls < 3000, "a worker never obeyed the plan"  # stops a loop that would never end
            print(f"worker {number} answered with the plan's limit after {polls} requests with its old limit")
    finally:
        for server in servers:
            server.stop()


# --- rows that reached the database without validation ----------------------------------------------------


def test_overrides_and_plan_rows_that_match_nothing_are_reported_by_the_system_checks(search):
    from django.core.checks import run_checks

    from ratelimit_app.models import Override

    plan = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=plan, policy=search, limit=10)
    PlanAssignment.objects.create(plan=plan, kind="header", header="X-Api-Key", value="k")
    Override.objects.create(policy=search, kind="ip", network=IP, limit=5)
    assert [m for m in run_checks() if m.id == "ratelimit_app.W007"] == []
    PlanAssignment.objects.update(value="")  # past the form: it matches no request
    PlanLimit.objects.update(limit=0)
    Override.objects.update(network="")
    found = sorted(m.msg for m in run_checks() if m.id == "ratelimit_app.W007")
    assert found == sorted([
        f"The assignment id {PlanAssignment.objects.get().pk} to plan 'pro' is invalid and is ignored: "
        "value: Required when it matches a header value.",
        f"The limit id {PlanLimit.objects.get().pk} of plan 'pro' is invalid and is ignored: "
        "limit: The limit must be at least 1 request per window. Give a limit, or tick exempt.",
        f"The override id {Override.objects.get().pk} of policy 'search' is invalid and is ignored: "
        "network: Required when it matches by ip.",
    ])
