"""usage() for a customer's dashboard: a caller sees only their own usage (subjects that name them, never one
the request merely writes), and looking at an unused quota costs one Redis call and no query."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app import quotas
from ratelimit_app.models import QuotaUsage
from tests.helpers import count_round_trips, make_policy

KEY = "sk_live_0123456789abcdef"


def _request(ip="203.0.113.9", user=None, path="/api/search", **headers):
    made = RequestFactory().get(path, REMOTE_ADDR=ip, **headers)
    made.user = user or AnonymousUser()
    return made


def _shown(answer) -> dict[str, tuple[int, int, int]]:
    assert answer.status_code == 200
    return {item["policy"]: (item["used"], item["limit"], item["remaining"]) for item in answer.json()["limits"]}


# --- whose usage a caller sees ------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls("tests.usage_urls")
def test_an_anonymous_caller_naming_alice_in_the_query_does_not_see_alices_login_attempts(client):
    make_policy(name="login", action="/accounts/login/", methods="POST", limit=5, window=300, key="param:username")
    make_policy(name="api-per-ip", action="api:search", limit=60, window=60, key="ip")
    for _ in range(4):  # someone tried alice's password four times
        client.post("/accounts/login/", {"username": "alice", "password": "guess"}, REMOTE_ADDR="198.51.100.4")
    shown = _shown(client.get("/api/usage/?username=alice", REMOTE_ADDR="203.0.113.9"))
    assert "login" not in shown  # was (4, 5, 1): alice's attempts, and how many are left to guess with
    assert shown == {"api-per-ip": (0, 60, 60)}  # what the caller's own address used


@pytest.mark.django_db
@pytest.mark.urls("tests.usage_urls")
def test_a_caller_sees_the_usage_counted_per_their_user_address_api_key_or_a_key_function_that_names_them(client):
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    own = {
        "per-user": "user", "per-user-or-ip": "user_or_ip", "per-ip": "ip", "per-key": "header:X-Api-Key",
        "per-ip-and-key": "ip,header:X-Api-Key", "per-account": "tests.usage_urls.account_of",
    }
    others = {  # everybody's count, a value anyone may write, or a function that does not say it names the caller
        "everyone": "global", "per-agent": "header:User-Agent", "per-name": "param:username",
        "per-ip-and-name": "ip,param:username", "per-team": "tests.usage_urls.team_named",
    }
    for name, key in {**own, **others}.items():
        make_policy(name=name, action="api:search", limit=100, window=3600, key=key)
    month = make_policy(name="api-month", action="api:search", strategy="calendar_quota", period="month",
                        time_zone="UTC", limit=1000, window=1, key="header:X-Api-Key")
    headers = {"HTTP_X_API_KEY": KEY, "HTTP_USER_AGENT": "curl/8.5"}
    for _ in range(3):
        assert ratelimit_app.hit(_request(user=alice, path="/api/search?username=alice&team=red", **headers),
                                 "api:search").allowed

    client.force_login(alice)
    shown = _shown(client.get("/api/usage/?username=alice&team=red", REMOTE_ADDR="203.0.113.9", **headers))
    assert shown == {**{name: (3, 100, 97) for name in own}, month.name: (3, 1000, 997)}
    client.force_login(bob)  # another customer, from another address, with another key: none of alice's counts
    shown = _shown(client.get("/api/usage/?username=alice&team=red", REMOTE_ADDR="198.51.100.4",
                              HTTP_X_API_KEY="sk_live_other000000000", HTTP_USER_AGENT="curl/8.5"))
    assert shown == {**{name: (0, 100, 100) for name in own}, month.name: (0, 1000, 1000)}


def test_an_anonymous_caller_without_a_key_sees_the_limits_of_their_address_only(db):
    make_policy(name="per-user", action="api:search", limit=10, window=60, key="user")
    make_policy(name="per-key", action="api:search", limit=10, window=60, key="header:X-Api-Key")
    make_policy(name="per-user-or-ip", action="api:search", limit=10, window=60, key="user_or_ip")
    assert [item.policy for item in ratelimit_app.usage(_request())] == ["per-user-or-ip"]


# --- what looking costs ----------------------------------------------------------------------------------------


def _monthly():
    return make_policy(name="api-month", action="api:search", strategy="calendar_quota", period="month",
                       time_zone="UTC", limit=1000, window=1, key="header:X-Api-Key")


def _script_calls(redis_client) -> int:
    stats = redis_client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("fcall", "fcall_ro", "evalsha", "eval"))


@pytest.mark.django_db
def test_usage_of_a_quota_unused_this_period_costs_one_redis_call_and_no_query(server, django_assert_num_queries):
    import redis

    _monthly()
    caller = _request(HTTP_X_API_KEY=KEY)
    assert [item.used for item in ratelimit_app.usage(caller)] == [0]  # the first look of the period reads the database
    own = redis.Redis.from_url(server.url)
    own.config_resetstat()
    with django_assert_num_queries(0), count_round_trips() as trips:
        looks = [[(item.used, item.remaining) for item in ratelimit_app.usage(caller)] for _ in range(10)]
    assert looks == [[(0, 1000)]] * 10
    assert (trips[0], _script_calls(own)) == (10, 10)  # were 20 and 20, and 10 queries: the saved usage each time
    assert ratelimit_app.hit(caller, "api:search").decisions[0].count == 1  # looking counted nothing


@pytest.mark.django_db(transaction=True)
def test_usage_shows_what_the_database_saved_each_time_redis_loses_the_period(redis_client,
                                                                              django_assert_num_queries):
    _monthly()
    caller = _request(HTTP_X_API_KEY=KEY)
    for _ in range(3):
        assert ratelimit_app.hit(_request(HTTP_X_API_KEY=KEY), "api:search").allowed
    assert quotas.saver.save() == 1
    quotas.saver.discard()
    redis_client.flushall()  # Redis lost the month: 3 saved
    assert [item.used for item in ratelimit_app.usage(caller)] == [3]
    with django_assert_num_queries(0):
        assert [[item.used for item in ratelimit_app.usage(caller)] for _ in range(5)] == [[3]] * 5
    counted = [ratelimit_app.hit(_request(HTTP_X_API_KEY=KEY), "api:search").decisions[0].count for _ in range(2)]
    assert counted == [4, 5]  # the month goes on from the 3 saved
    assert quotas.saver.save() == 1
    quotas.saver.discard()
    redis_client.flushall()  # lost again, after more was saved: the newer saved usage shows, nothing older
    assert QuotaUsage.objects.get().used == 5
    assert [[item.used for item in ratelimit_app.usage(caller)] for _ in range(2)] == [[5]] * 2
    assert ratelimit_app.hit(_request(HTTP_X_API_KEY=KEY), "api:search").decisions[0].count == 6


@pytest.mark.django_db
def test_usage_and_the_live_pages_json_say_no_plan_alike_with_null(admin_client):
    from ratelimit_app.models import Plan, PlanAssignment, PlanLimit

    row = make_policy(name="api-per-ip", action="api:search", limit=60, window=60, key="ip")
    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=row, limit=600)
    PlanAssignment.objects.create(plan=pro, kind="ip", network="198.51.100.4")
    for ip in ("203.0.113.9", "198.51.100.4"):
        ratelimit_app.hit(_request(ip=ip), "api:search")
    live = admin_client.get(f"/admin/ratelimit_app/policy/{row.pk}/live/?format=json").json()
    on_the_live_page = {s["subject"]: s["plan"] for s in live["subjects"]}
    by_usage = {f"ip:{ip}": ratelimit_app.usage(_request(ip=ip))[0].as_dict()["plan"]
                for ip in ("203.0.113.9", "198.51.100.4")}
    assert by_usage == on_the_live_page == {"ip:203.0.113.9": None, "ip:198.51.100.4": "pro"}


# --- metered units ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_usage_in_tokens_reads_as_a_customer_would_and_carries_the_unit():
    from ratelimit_app import engine
    from ratelimit_app.policies import compile_policy
    from tests.helpers import check

    month = make_policy(name="chat-month", action="/api/", strategy="calendar_quota", period="month",
                        time_zone="UTC", limit=10_000_000, key="ip", unit="tokens")
    make_policy(name="api-per-ip", action="/api/", limit=60, window=60, key="ip")
    assert engine.decide([check(compile_policy(month), "ip:203.0.113.9")], cost=7_412_009).allowed
    items = {item.policy: item for item in ratelimit_app.usage(_request())}
    tokens, requests = items["chat-month"], items["api-per-ip"]
    assert str(tokens) == "7,412,009 / 10,000,000 tokens this month"
    assert (tokens.unit, tokens.remaining, tokens.overage) == ("tokens", 2_587_991, 0)
    assert tokens.as_dict()["unit"] == "tokens" and tokens.as_dict()["overage"] == 0
    assert str(requests) == "0 / 60 requests per 1 min" and requests.unit == "requests"


@pytest.mark.django_db
def test_usage_beyond_the_limit_after_a_settle_is_reported_as_overage():
    from ratelimit_app.policies import compile_policy
    from tests.helpers import settled

    day = make_policy(name="chat-day", action="/api/", strategy="calendar_quota", period="day", time_zone="UTC",
                      limit=1000, key="ip", unit="tokens")
    settled(compile_policy(day), "ip:203.0.113.9", used=1500, estimate=100)
    [item] = ratelimit_app.usage(_request())
    assert (item.used, item.limit, item.remaining, item.overage) == (1500, 1000, 0, 500)
    assert str(item) == "1,500 / 1,000 tokens today"
