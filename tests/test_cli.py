"""manage.py ratelimit: status, top, reset (subjects written as a person would) and test, against
counts made by real requests to the demo."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from ratelimit_app.models import Policy
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


def ratelimit(*args) -> str:
    out = StringIO()
    call_command("ratelimit", *args, stdout=out)
    return out.getvalue()


def search(client, ip=IP, times=1, **extra):
    return [client.get("/demo/search/?q=a", REMOTE_ADDR=ip, **extra).status_code for _ in range(times)]


@pytest.fixture
def policy():
    return make_policy(name="search-per-ip", action="demo:search", limit=3, window=60, key="ip")


def lines_of(output: str) -> dict[str, list[str]]:
    """Table rows by their first cell."""
    return {line.split()[0]: line.split() for line in output.splitlines() if line.strip()}


# --- status ------------------------------------------------------------------------------------


def test_status_lists_every_policy_with_active_subjects_and_denials(client, policy):
    make_policy(name="quiet", action="/api/", limit=10, window=600, mode="shadow", enabled=False)
    search(client, IP, 5)
    search(client, "198.51.100.2", 1)
    rows = lines_of(ratelimit("status"))
    assert rows["search-per-ip"][1:] == ["demo:search", "3", "/", "1", "min", "fixed_window", "ip", "enforce", "yes", "2", "2"]
    assert rows["quiet"][-4:] == ["shadow", "no", "0", "0"]


def test_status_as_json(client, policy):
    search(client, IP, 4)
    [entry] = json.loads(ratelimit("status", "--json"))
    assert {k: entry[k] for k in ("name", "limit", "window", "mode", "active", "allowed", "denied")} == {
        "name": "search-per-ip", "limit": 3, "window": 60, "mode": "enforce", "active": 1, "allowed": 3, "denied": 1,
    }


def tokens_used(policy: Policy, used: int, who: str = f"ip:{IP}") -> None:
    """`used` tokens counted for `who`, as a request admitted on that much would take them."""
    from ratelimit_app import engine
    from ratelimit_app.policies import compile_policy
    from tests.helpers import check

    assert engine.decide([check(compile_policy(policy), who)], cost=used).allowed


def test_status_top_and_test_speak_in_the_policys_unit(client):
    tokens = make_policy(name="chat-tokens", action="demo:search", limit=20_000, window=60, unit="tokens")
    tokens_used(tokens, 1834)
    rows = lines_of(ratelimit("status"))
    assert rows["chat-tokens"][1:7] == ["demo:search", "20,000", "tokens", "/", "1", "min"]
    assert json.loads(ratelimit("status", "--json"))[0]["unit"] == "tokens"

    top = ratelimit("top", "chat-tokens")
    assert top.startswith("chat-tokens: 20,000 tokens / 1 min, fixed_window per ip, enforce.")
    header, row = top.splitlines()[1:3]
    assert header.split()[:5] == ["subject", "tokens", "limit", "remaining", "reset"]
    assert row.split()[:4] == [f"ip:{IP}", "1,834", "20,000", "18,166"]

    said = ratelimit("test", "GET", "/demo/search/", "--ip", IP)
    assert "The cost is the estimate the policies in tokens admit the request on" in said
    assert " ".join(lines_of(said)["chat-tokens"][-10:]) == "20,000 tokens / 1 min 1,834 allow, 18,166 tokens left"


def test_test_charges_a_request_policy_one_request_beside_a_tokens_policy():
    from ratelimit_app.models import ActionCost

    make_policy(name="chat-requests", action="demo:search", limit=3, window=60)
    make_policy(name="chat-tokens", action="demo:search", limit=20_000, window=60, unit="tokens")
    ActionCost.objects.create(action="demo:search", cost=1008)  # the admin's estimate
    said = ratelimit("test", "GET", "/demo/search/", "--ip", IP)
    assert "The policies counting requests count it as one request." in said
    rows = lines_of(said)
    assert rows["chat-requests"][-3:] == ["allow,", "3", "left"]  # not "the cost is more than it ever allows"
    assert " ".join(rows["chat-tokens"][-4:]) == "allow, 20,000 tokens left"


def test_top_says_how_far_over_its_limit_a_subject_in_debt_is():
    from ratelimit_app.policies import compile_policy
    from tests.helpers import settled

    tokens = make_policy(name="chat-tokens", action="demo:search", limit=20_000, window=60, unit="tokens")
    settled(compile_policy(tokens), f"ip:{IP}", used=21_500, estimate=1000)
    row = ratelimit("top", "chat-tokens").splitlines()[2]
    assert row.split()[:4] == [f"ip:{IP}", "21,500", "20,000", "0"] and row.endswith("blocked, 1,500 over")


def test_status_says_when_redis_is_unreachable_and_still_lists_policies(policy, settings):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    out = StringIO()
    with pytest.raises(CommandError, match="Redis is unreachable"):
        call_command("ratelimit", "status", stdout=out)
    assert lines_of(out.getvalue())["search-per-ip"][-2:] == ["?", "?"]


# --- top ---------------------------------------------------------------------------------------


def test_top_shows_the_busiest_subjects_first(client, policy):
    search(client, "198.51.100.1", 1)
    search(client, "198.51.100.2", 4)
    search(client, "198.51.100.3", 2)
    output = ratelimit("top", "search-per-ip")
    assert "3 active, 1 at the limit; this window 6 allowed, 1 denied." in output
    subjects = [line.split()[0] for line in output.splitlines() if line.startswith("ip:")]
    assert subjects == ["ip:198.51.100.2", "ip:198.51.100.3", "ip:198.51.100.1"]
    assert lines_of(output)["ip:198.51.100.2"][1:4] + lines_of(output)["ip:198.51.100.2"][-1:] == ["3", "3", "0", "blocked"]


def test_top_limits_the_rows_and_says_how_many_there_are(client, policy):
    for i in range(5):
        search(client, f"198.51.100.{i}")
    output = ratelimit("top", "search-per-ip", "--limit", "2")
    assert len([line for line in output.splitlines() if line.startswith("ip:")]) == 2
    assert "(top 2 of 5" in output


def test_top_of_an_unknown_policy_names_the_known_ones(policy):
    with pytest.raises(CommandError, match="No policy named 'serch'. Policies: search-per-ip."):
        ratelimit("top", "serch")


def test_top_refuses_a_limit_out_of_range(policy):
    with pytest.raises(CommandError, match="between 1 and 1000"):
        ratelimit("top", "search-per-ip", "--limit", "0")


# --- reset -------------------------------------------------------------------------------------


def test_reset_an_address_as_a_person_writes_it(client, policy):
    search(client, IP, 3)
    search(client, "198.51.100.9", 3)
    assert ratelimit("reset", "search-per-ip", f"ip:{IP}") == f"Counts of subject ip:{IP} reset for search-per-ip.\n"
    assert search(client, IP) == [200]
    assert search(client, "198.51.100.9") == [429]


@pytest.mark.parametrize("written", ["user:alice", "user:{pk}"])
def test_reset_a_user_by_username_or_id(client, written):
    make_policy(name="search-per-user", action="demo:search", limit=1, key="user")
    alice = User.objects.create_user("alice")
    client.force_login(alice)
    assert search(client, times=2) == [200, 429]
    assert "reset" in ratelimit("reset", "search-per-user", written.format(pk=alice.pk))
    assert search(client) == [200]


def test_reset_an_api_key(client):
    make_policy(name="search-per-key", action="demo:search", limit=1, key="header:X-Api-Key")
    assert search(client, times=2, HTTP_X_API_KEY="key-of-alice-0001") == [200, 429]
    assert search(client, times=2, HTTP_X_API_KEY="key-of-bob-0002") == [200, 429]
    output = ratelimit("reset", "search-per-key", "header:X-Api-Key=key-of-alice-0001")
    assert output == "Counts of subject header:X-Api-Key=…0001 reset for search-per-key.\n"  # masked, as in the admin
    assert search(client, HTTP_X_API_KEY="key-of-alice-0001") == [200]
    assert search(client, HTTP_X_API_KEY="key-of-bob-0002") == [429]


def test_reset_by_the_key_the_live_page_shows(client, admin_client, policy):
    search(client, IP, 3)
    [subject] = admin_client.get(f"/admin/ratelimit_app/policy/{policy.pk}/live/?format=json").json()["subjects"]
    ratelimit("reset", "search-per-ip", subject["key"])
    assert search(client, IP) == [200]


def test_reset_all_subjects(client, policy):
    search(client, IP, 3)
    search(client, "198.51.100.9", 3)
    assert ratelimit("reset", "search-per-ip", "--all") == "Counts of every subject reset for search-per-ip.\n"
    assert search(client, IP) == search(client, "198.51.100.9") == [200]


def test_reset_of_a_subject_without_counts_says_so(policy):
    assert "had no count under search-per-ip: nothing to reset" in ratelimit("reset", "search-per-ip", f"ip:{IP}")


@pytest.mark.parametrize(
    "args, message",
    [
        (["search-per-ip", "user:1"], "Nothing was reset: 'user:1' is not a subject of the key 'ip'"),
        (["search-per-ip", "ip:999.1.1.1"], "is not an IP address"),
        (["search-per-ip"], "Give either a SUBJECT"),
        (["search-per-ip", f"ip:{IP}", "--all"], "Give either a SUBJECT"),
        (["nosuch", f"ip:{IP}"], "No policy named 'nosuch'"),
    ],
)
def test_bad_reset_says_why_and_changes_nothing(client, policy, args, message):
    search(client, IP, 4)
    with pytest.raises(CommandError, match=message):
        ratelimit("reset", *args)
    assert search(client, IP) == [429]
    assert Policy.objects.get(pk=policy.pk).generation == 0


# --- test --------------------------------------------------------------------------------------


def test_test_prints_what_each_policy_would_decide_and_counts_nothing(client, policy):
    make_policy(name="site-shadow", action="*", limit=100, mode="shadow")
    search(client, IP, 3)
    output = ratelimit("test", "get", "/demo/search/", "--ip", IP)
    rows = lines_of(output)
    assert "is known by the names: demo:search" in output
    assert " ".join(rows["search-per-ip"][-5:-2]) == "deny, retry in" and 0 < int(rows["search-per-ip"][-2]) <= 60
    assert " ".join(rows["site-shadow"][-3:]) == "allow, 97 left"
    assert "The request would be denied (429)." in output
    assert "allow, 3 left" in ratelimit("test", "GET", "/demo/search/", "--ip", "198.51.100.1")
    assert search(client, "198.51.100.1", 3) == [200, 200, 200]  # the tests counted nothing


def test_test_with_a_user_and_a_header(client):
    make_policy(name="search-per-user", action="demo:search", limit=5, key="user")
    make_policy(name="search-per-key", action="demo:search", limit=5, key="header:X-Api-Key")
    alice = User.objects.create_user("alice")
    output = ratelimit("test", "GET", "/demo/search/", "--user", "alice", "--header", "X-Api-Key: abcdefgh-1234")
    assert "user:alice" in lines_of(output)["search-per-user"]  # the request's user, by name
    assert "header:X-Api-Key=…1234" in output
    anonymous = ratelimit("test", "GET", "/demo/search/")
    assert "does not apply: no subject (user cannot be computed)" in anonymous


def test_test_of_a_request_no_policy_matches(policy):
    assert "No enabled policy matches this request: it is not limited." in ratelimit("test", "GET", "/nothing/")


@pytest.mark.parametrize(
    "args, message",
    [
        (["FETCH", "/demo/search/"], "method: Select a valid choice"),
        (["GET", "demo/search/"], "path: A path starts with '/'"),
        (["GET", "/demo/search/", "--user", "nobody"], "username: No user named 'nobody'"),
        (["GET", "/demo/search/", "--ip", "localhost"], "ip: Enter a valid IPv4 or IPv6 address"),
        (["GET", "/demo/search/", "--header", "no colon"], "headers: Line 1 is not 'Name: value'"),
    ],
)
def test_test_refuses_bad_input_with_a_clear_error(policy, args, message):
    with pytest.raises(CommandError, match=message):
        ratelimit("test", *args)


def test_test_says_a_cost_above_what_a_plan_ever_allows_is_refused_for_good(policy):
    """A plan's limit below the action's cost: no wait admits the request, and no retry time is given."""
    from ratelimit_app.models import ActionCost, Plan, PlanAssignment, PlanLimit

    ActionCost.objects.create(action="demo:search", cost=2)
    small = Plan.objects.create(name="small")
    PlanLimit.objects.create(plan=small, policy=policy, limit=1)
    PlanAssignment.objects.create(plan=small, kind="ip", network=f"{IP}/32")
    said = ratelimit("test", "GET", "/demo/search/", "--ip", IP)
    assert " ".join(lines_of(said)["search-per-ip"][-11:]) == "deny: the cost is more than it ever allows at once"
    assert "The request would be denied (429)." in said
