"""The helpers of ratelimit_app.testing that users' tests call: a policy, an override or a plan for the
length of a block, and what a response was charged."""

from __future__ import annotations

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from ratelimit_app.models import ActionCost, Override, Plan, Policy
from ratelimit_app import testing
from ratelimit_app.testing import assert_charged, charged, temporary_override, temporary_plan, temporary_policy

@pytest.fixture
def home(db):
    """Two requests a minute per address on the demo's home page."""
    with temporary_policy(name="home-per-ip", action="home", limit=2, window=60, strategy="fixed_window", key="ip"):
        yield


def statuses(client, times: int = 3) -> list[int]:
    return [client.get("/").status_code for _ in range(times)]


def test_a_temporary_policy_limits_inside_its_block_only(db, client):
    with temporary_policy(name="home-per-ip", action="home", limit=1, window=60, key="ip"):
        assert statuses(client, 2) == [200, 429]
    assert statuses(client, 2) == [200, 200]
    assert not Policy.objects.filter(name="home-per-ip").exists()


def test_a_temporary_override_exempts_an_address_inside_its_block_only(client, home):
    with temporary_override("home-per-ip", ip="127.0.0.1", exempt=True):
        assert statuses(client) == [200, 200, 200]
    assert statuses(client) == [200, 200, 429]
    assert not Override.objects.exists()


def test_a_temporary_override_gives_a_user_another_limit(client, home, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    with temporary_override("home-per-ip", user=alice, limit=4):
        assert statuses(client, 3) == [200, 200, 429]  # by address: alice is not logged in
    policy = Policy.objects.get(name="home-per-ip")
    policy.key = "user_or_ip"
    policy.save()
    client.force_login(alice)
    with temporary_override(policy, user=alice, limit=4):
        assert statuses(client, 5) == [200, 200, 200, 200, 429]


def test_a_temporary_plan_sets_the_limit_of_its_subjects_inside_its_block_only(client, home):
    with temporary_plan({"home-per-ip": 3}, ip="127.0.0.0/8"):
        assert statuses(client, 4) == [200, 200, 200, 429]
    assert not Plan.objects.exists()


def test_a_temporary_plan_without_a_limit_exempts(client, home):
    with temporary_plan({"home-per-ip": None}, header="X-Api-Key", value="sk-test"):
        assert [client.get("/", HTTP_X_API_KEY="sk-test").status_code for _ in range(3)] == [200, 200, 200]
        assert statuses(client) == [200, 200, 429]


def test_a_temporary_override_matches_exactly_one_kind_of_subject(home):
    with pytest.raises(TypeError, match="Match exactly one of"):
        with temporary_override("home-per-ip", exempt=True):
            pass
    with pytest.raises(TypeError, match="Match exactly one of"):
        with temporary_override("home-per-ip", exempt=True, ip="10.0.0.1", header="X-Api-Key", value="k"):
            pass


def test_assert_charged_passes_for_the_units_taken_and_zero_for_a_refused_request(client, home):
    first, second, refused = (client.get("/") for _ in range(3))
    assert_charged(first, "home-per-ip", 1)
    assert_charged(second, policy="home-per-ip", units=1)
    assert_charged(refused, "home-per-ip", 0)
    assert charged(refused) == {"home-per-ip": 0}


def test_assert_charged_reads_the_admins_cost(client, home):
    ActionCost.objects.create(action="home", cost=2)
    response = client.get("/")
    assert_charged(response, "home-per-ip", 2)
    assert response.headers["RateLimit"].startswith('"home-per-ip";r=0;')


def test_assert_charged_says_what_the_response_was_charged(client, home):
    response = client.get("/")
    with pytest.raises(AssertionError) as failed:
        assert_charged(response, "home-per-ip", 3)
    said = str(failed.value)
    assert "Expected 3 unit(s) of policy 'home-per-ip', charged 1" in said
    assert '"RateLimit": \'"home-per-ip";r=1;' in said.replace("'RateLimit'", '"RateLimit"')
    with pytest.raises(AssertionError, match="not decided under 'other'"):
        assert_charged(response, "other", 1)


@pytest.mark.django_db(transaction=True)  # the async client's thread reads the policies SQLite holds
async def test_assert_charged_reads_an_async_clients_response(async_client, home):
    response = await async_client.get("/")
    assert_charged(response, "home-per-ip", 1)


def test_assert_charged_asks_for_the_request_of_a_response_made_without_a_test_client(home):
    with pytest.raises(TypeError, match="pass request="):
        assert_charged(HttpResponse("made by hand"), "home-per-ip", 1)
    assert charged(HttpResponse(), request=RequestFactory().get("/")) == {}


def test_an_override_of_a_policy_a_view_declares_needs_no_request_first(db, settings):
    settings.ROOT_URLCONF = "tests.code_urls"
    with temporary_override("comments-per-ip", ip="127.0.0.1", exempt=True) as override:
        assert override.policy.name == "comments-per-ip"


def test_an_override_of_a_policy_nobody_declared_says_which_there_are(home):
    with pytest.raises(LookupError, match=r"No policy named 'nope'; the policies are \['home-per-ip'\]"):
        with temporary_override("nope", ip="127.0.0.1", exempt=True):
            pass


def test_reset_counters_needs_no_database_access(redis_client):
    """A test without the database (no django_db mark) empties the counters too, e.g. in an autouse fixture."""
    redis_client.set("rl:a-counter", 1)
    redis_client.set("someone-elses", 1)
    assert testing.reset_counters() == 1
    left = set(redis_client.keys("*"))
    assert b"rl:a-counter" not in left and b"someone-elses" in left


def test_assert_charged_reads_a_shadow_policy_which_sends_no_headers(client, home):
    with temporary_policy(name="watching", action="*", limit=1, window=60, key="ip", mode="shadow"):
        response = client.get("/")
    assert "watching" not in response.headers["RateLimit-Policy"]
    assert_charged(response, "watching", 1)
    assert_charged(response, "home-per-ip", 1)
