"""Metered usage through the doors: a request is admitted on its estimate, the view settles what it used
(ratelimit_app.settle), and its policies in that unit move by the difference as the request ends;
content-bytes settles itself from the response. What cannot be settled is a clear error, never a 500."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory

import ratelimit_app
from ratelimit_app import closing, engine
from ratelimit_app.policies import get_index
from tests.helpers import check, make_policy
from tests.test_concurrency import _until

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.metering_urls")]

IP = "203.0.113.7"


def tokens_policy(**fields):
    values = {"name": "llm-tokens", "action": "llm", "limit": 1000, "window": 3600, "strategy": "fixed_window",
              "unit": "tokens"}
    return make_policy(**{**values, **fields})


def started(request):
    """A request made by hand, started as a handler starts one (request_started in this context)."""
    closing.request_began(environ=request.environ)
    return request


def ended() -> None:
    """request_finished, as the handler sends it once the response is closed."""
    closing.request_ended()


def used_now(name: str = "llm-tokens", who: str = IP) -> int:
    """The units the policy counts for `who` now (read on the connection the settles were written on)."""
    compiled = next(p for p in get_index().policies if p.name == name)
    return engine.decide([check(compiled, f"ip:{who}")], dry_run=True).decisions[0].count


@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_window", "token_bucket"])
def test_a_request_is_charged_what_it_settled_not_its_estimate(client, strategy):
    tokens_policy(strategy=strategy, limit=100_000)  # a token bucket: a token every 36 ms comes back
    assert client.get("/llm/?used=1834", REMOTE_ADDR=IP).status_code == 200
    assert 1834 - used_now() <= (1 if strategy == "token_bucket" else 0)
    assert client.get("/llm/?used=3", REMOTE_ADDR=IP).status_code == 200
    assert 1837 - used_now() <= (2 if strategy == "token_bucket" else 0)


def test_a_calendar_quota_is_charged_what_was_settled():
    make_policy(name="llm-month", action="llm", limit=10_000_000, window=31 * 86400, strategy="calendar_quota",
                period="month", time_zone="UTC", unit="tokens")
    Client().get("/llm/?used=7412009", REMOTE_ADDR=IP)
    assert used_now("llm-month") == 7_412_009


def test_a_request_that_settles_nothing_keeps_its_estimate(client):
    tokens_policy()
    client.get("/download/?size=3", REMOTE_ADDR=IP)  # not metered by this policy
    ratelimit_app.hit(RequestFactory().get("/", REMOTE_ADDR=IP), "llm", cost=10)
    assert used_now() == 10


@pytest.mark.parametrize("path", ["/llm/async/", "/llm/streamed/", "/llm/hit/"])
def test_every_way_of_settling_is_charged(client, path):
    tokens_policy()
    response = client.get(f"{path}?used=77", REMOTE_ADDR=IP)
    assert response.status_code == 200
    if response.streaming:  # the test client leaves the body to be read, and closed
        assert b"".join(response.streaming_content).endswith(b"done")
        response.close()
    assert used_now() == 77


@pytest.mark.parametrize("middleware", [True, False])
def test_a_drf_view_settles_through_the_throttle(settings, caplog, middleware):
    if not middleware:
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitMiddleware" not in m]
    tokens_policy()
    response = Client().post("/llm/drf/", {"used": 512}, REMOTE_ADDR=IP)
    assert response.status_code == 200
    assert used_now() == 512
    assert "limiter failed" not in caplog.text  # its answer, rendered after the door, is not read there


@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_window", "token_bucket"])
def test_requests_and_tokens_on_one_endpoint_are_each_charged_in_their_own_unit(client, strategy):
    make_policy(name="chat-requests", action="chat", limit=3, window=60, strategy=strategy)
    tokens_policy(name="chat-tokens", action="chat", limit=20_000, window=60, strategy=strategy)
    used = [900, 1500, 40]  # a token bucket's come back as the test runs: one every 3 ms
    for tokens in used:
        response = client.post("/chat/", {"used": tokens}, REMOTE_ADDR=IP)
        assert response.status_code == 200
        assert response["RateLimit"].startswith('"chat-requests";r=')  # the nearest to its limit first
    refused = client.post("/chat/", {"used": 5}, REMOTE_ADDR=IP)
    assert refused.status_code == 429
    assert "chat-requests" in refused.content.decode()
    assert used_now("chat-requests") == 3  # one a chat, not its 1,008 tokens
    assert used_now("chat-tokens") == sum(used) or strategy == "token_bucket"  # settled, not estimated
    assert sum(used) - 1008 < used_now("chat-tokens") <= sum(used)


def test_a_request_charged_in_its_own_units_is_refused_from_memory_for_each(client):
    make_policy(name="chat-requests", action="chat", limit=1, window=60)
    tokens_policy(name="chat-tokens", action="chat", limit=20_000, window=60)
    assert client.post("/chat/", {"used": 10}, REMOTE_ADDR=IP).status_code == 200
    for _ in range(2):  # the second refusal answered from the deny cache, under the request policy's own charge
        refused = client.post("/chat/", {"used": 10}, REMOTE_ADDR=IP)
        assert refused.status_code == 429
        assert "costs" not in refused.content.decode()  # one request, as that policy counts
    assert used_now("chat-requests") == 1
    assert used_now("chat-tokens") == 10


def test_content_bytes_counts_a_drf_answer_once_it_is_rendered(client):
    bytes_policy()
    response = client.get("/download/api/?size=100", REMOTE_ADDR=IP, HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert used_now("download-bytes") == len(response.content) == len(b'{"data":""}') + 100


def test_usage_beyond_the_limit_is_debt_refused_until_the_window_moves_on(client):
    tokens_policy(limit=100)
    assert client.get("/llm/?used=250", REMOTE_ADDR=IP).status_code == 200  # admitted on 10, used 250
    refused = client.get("/llm/?used=1", REMOTE_ADDR=IP)
    assert refused.status_code == 429
    assert '"llm-tokens";r=0' in refused["RateLimit"]
    assert used_now() == 250


def test_the_overage_cap_bounds_what_a_request_is_charged_beyond_its_estimate(client):
    tokens_policy(overage_cap=40)
    client.get("/llm/?used=900", REMOTE_ADDR=IP)
    assert used_now() == 50  # 10 estimated + at most 40 more
    client.get("/llm/?used=2", REMOTE_ADDR=IP)
    assert used_now() == 52  # less than the estimate: given back whatever the cap


def test_a_view_that_fails_after_settling_is_charged_what_it_settled():
    tokens_policy()
    client = Client(raise_request_exception=False)
    assert client.get("/llm/failing/?used=33", REMOTE_ADDR=IP).status_code == 500
    assert used_now() == 33


def test_a_refused_request_settles_nothing(client):
    tokens_policy(limit=10)
    client.get("/llm/?used=10", REMOTE_ADDR=IP)
    assert client.get("/llm/?used=5", REMOTE_ADDR=IP).status_code == 429  # settle() never ran
    assert used_now() == 10


# --- content-bytes settles itself ------------------------------------------------------------------


def bytes_policy(**fields):
    values = {"name": "download-bytes", "action": "download", "limit": 10_000, "window": 3600,
              "strategy": "sliding_window", "unit": "content-bytes"}
    return make_policy(**{**values, **fields})


def test_content_bytes_counts_the_bytes_of_each_response(client):
    bytes_policy()
    client.get("/download/?size=1234", REMOTE_ADDR=IP)
    assert used_now("download-bytes") == 1234
    client.head("/download/?size=1234", REMOTE_ADDR=IP)  # a HEAD sends no body
    assert used_now("download-bytes") == 1234


def test_content_bytes_counts_the_bytes_a_streamed_body_really_sent(client):
    bytes_policy()
    response = client.get("/download/streamed/?size=300", REMOTE_ADDR=IP)
    assert len(b"".join(response.streaming_content)) == 600
    response.close()
    assert used_now("download-bytes") == 600


def test_a_streamed_body_closed_early_is_charged_what_it_sent(client):
    bytes_policy()
    response = client.get("/download/streamed/?size=300", REMOTE_ADDR=IP)
    body = iter(response.streaming_content)
    next(body), next(body)
    response.close()
    assert used_now("download-bytes") == 4


# --- what cannot be settled ------------------------------------------------------------------------


def test_settling_twice_for_one_request_keeps_the_first_and_says_so_without_a_500(caplog):
    tokens_policy()
    response = Client().get("/llm/twice/", REMOTE_ADDR=IP)
    assert response.status_code == 200 and response.content == b"settled"
    assert "settle(): tokens were already settled for this request (1): 2 ignored" in caplog.text
    assert used_now() == 1


@pytest.mark.parametrize(("used", "error", "message"), [
    ({"tokens": 1.5}, TypeError, "tokens must be a whole number of units, not 1.5"),
    ({"tokens": True}, TypeError, "not True"),
    ({"tokens": "12"}, TypeError, "not '12'"),
    ({"Tokens": 1}, ValueError, "'Tokens' is not a unit"),
    ({"requests": 1}, ValueError, "requests are counted before the view"),
    ({}, TypeError, "settle\\(\\) needs what the request used"),
])
def test_what_is_not_an_amount_of_a_unit_is_refused_with_why(rf, used, error, message):
    with pytest.raises(error, match=message):
        ratelimit_app.settle(rf.get("/"), **used)


@pytest.mark.parametrize("used", [-1, 2**31, 10**30])
def test_an_amount_out_of_range_is_ignored_with_an_error_logged_not_a_500(client, caplog, used):
    """What a model reports is known only as the request runs: a count it got wrong never costs the
    caller the answer. The estimate stands, and the operator reads why."""
    tokens_policy()
    response = client.get(f"/llm/?used={used}", REMOTE_ADDR=IP)
    assert response.status_code == 200 and response.content == b"done"
    assert f"settle(): tokens={used} is out of range: from 0 to 2147483647 units a request; ignored" in caplog.text
    assert used_now() == 10  # the estimate


def test_a_unit_with_a_hyphen_is_settled_with_an_underscore(rf):
    make_policy(name="gpu", action="gpu", limit=100, window=3600, strategy="fixed_window", unit="gpu-seconds")
    request = started(rf.get("/", REMOTE_ADDR=IP))
    ratelimit_app.hit(request, "gpu", cost=5)
    ratelimit_app.settle(request, gpu_seconds=7)
    ended()  # request_finished: what no door sent goes then
    assert used_now("gpu") == 7


def test_a_settle_after_the_request_ended_says_so(rf):
    tokens_policy()
    request = started(rf.get("/", REMOTE_ADDR=IP))
    ratelimit_app.hit(request, "llm", cost=10)
    ended()
    with pytest.raises(ValueError, match="this request has ended"):
        ratelimit_app.settle(request, tokens=3)
    assert used_now() == 10


def test_a_settle_for_a_request_never_decided_or_of_no_metered_policy_is_ignored(rf):
    ratelimit_app.settle(rf.get("/"), tokens=5)  # no door saw it
    tokens_policy()
    request = started(rf.get("/", REMOTE_ADDR=IP))
    ratelimit_app.hit(request, "other-action")
    ratelimit_app.settle(request, tokens=5)
    ended()
    assert used_now() == 0


@pytest.mark.django_db(transaction=True)
async def test_an_async_view_settles_through_the_async_doors():
    from asgiref.sync import sync_to_async
    from django.db import connections

    from tests.test_async import client_at

    await sync_to_async(tokens_policy)()
    try:
        response = await client_at(IP).get("/llm/async/?used=61")
        assert response.status_code == 200
        # written on the async client's connection: read here on another one, once it has run
        assert await sync_to_async(_until)(lambda: used_now() == 61)
    finally:
        await sync_to_async(connections.close_all)()


# --- what settling costs on the wire -----------------------------------------------------------------


def test_a_metered_request_makes_no_more_round_trips_than_an_unmetered_one(client):
    from tests.helpers import count_round_trips

    tokens_policy(limit=10**9)
    make_policy(name="plain", action="plain", limit=10**9, window=3600, strategy="fixed_window")
    client.get("/llm/?used=5", REMOTE_ADDR=IP)  # loads the policies and the scripts
    client.get("/llm/plain/", REMOTE_ADDR=IP)
    with count_round_trips() as metered:
        for used in (5, 700, 10, 3):  # differing from the estimate or not
            client.get(f"/llm/?used={used}", REMOTE_ADDR=IP)
    with count_round_trips() as unmetered:
        for _ in range(4):
            client.get("/llm/plain/", REMOTE_ADDR=IP)
    assert metered[0] == unmetered[0] == 4
    assert used_now() == 5 + 5 + 700 + 10 + 3  # each settle rode on the next request's call


def test_settled_usage_no_request_carries_is_sent_within_a_second(client):
    tokens_policy()
    client.get("/llm/?used=250", REMOTE_ADDR=IP)
    # read on another connection: the settle waits on this thread's for its next call, or the timer
    compiled = next(p for p in get_index().policies if p.name == "llm-tokens")
    key = engine.counter_key(compiled, check(compiled, f"ip:{IP}").subject.key)
    assert _until(lambda: int(engine.client().get(key) or 0) // 1_000_000 == 250)


def test_a_shadow_policy_in_debt_reports_what_metering_would_have_refused(client, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="ratelimit_app")
    tokens_policy(limit=100, mode="shadow")
    client.get("/llm/?used=250", REMOTE_ADDR=IP)
    assert client.get("/llm/?used=1", REMOTE_ADDR=IP).status_code == 200  # never refused...
    assert "shadow policy 'llm-tokens' would deny" in caplog.text  # ...but says it would have been
    assert used_now() == 250


# --- every door, async included; what a settle may not do ---------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/llm/async/streamed/", "/llm/ahit/"])
async def test_an_async_streamed_body_and_an_ahit_caller_settle_with_asettle(path):
    from asgiref.sync import sync_to_async
    from django.db import connections

    from tests.test_async import client_at

    await sync_to_async(tokens_policy)()
    try:
        response = await client_at(IP).get(f"{path}?used=61")
        assert response.status_code == 200
        if response.streaming:
            assert b"".join([chunk async for chunk in response.streaming_content]).endswith(b"done")
        assert await sync_to_async(_until)(lambda: used_now() == 61)
    finally:
        await sync_to_async(connections.close_all)()


def test_an_estimate_from_a_callable_or_the_admins_action_cost_is_admitted_then_settled(client):
    from ratelimit_app.models import ActionCost

    tokens_policy(limit=1000)
    tokens_policy(name="priced-tokens", action="llm-priced", limit=1000)
    ActionCost(action="llm-priced", cost=900).save()
    refused = client.get("/llm/estimated/?estimate=1001&used=1", REMOTE_ADDR=IP)
    assert refused.status_code == 429  # the callable's estimate does not fit
    admitted = client.get("/llm/estimated/?estimate=600&used=20", REMOTE_ADDR=IP)
    assert admitted.status_code == 200 and '"llm-tokens";r=400;' in admitted["RateLimit"]
    assert used_now() == 20  # settled, not its 600
    admitted = client.get("/llm/priced/?used=30", REMOTE_ADDR=IP)
    assert admitted.status_code == 200 and '"priced-tokens";r=100;' in admitted["RateLimit"]  # admitted on 900
    assert used_now("priced-tokens") == 30


@pytest.mark.parametrize("path", ["/llm/hit/", "/llm/ahit/"])
def test_a_settle_for_a_request_hit_refused_is_ignored(client, path):
    tokens_policy(limit=10)
    assert client.get(f"{path}?used=10", REMOTE_ADDR=IP).status_code == 200
    refused = client.get(f"{path}?used=5000", REMOTE_ADDR=IP)  # settles after its refusal
    assert refused.status_code == 429 and refused.content == b"refused"
    assert used_now() == 10


def test_the_largest_settle_is_charged_and_leaves_debt_not_a_500(client):
    tokens_policy()
    assert client.get("/llm/?used=2147483647", REMOTE_ADDR=IP).status_code == 200
    assert client.get("/llm/?used=2147483647", REMOTE_ADDR=IP).status_code == 429  # in debt
    assert used_now() == 2147483647


def test_a_subject_in_debt_is_told_when_its_window_resets(client):
    tokens_policy(limit=100)
    client.get("/llm/?used=250", REMOTE_ADDR=IP)
    refused = client.get("/llm/?used=1", REMOTE_ADDR=IP)
    assert refused.status_code == 429
    reset = int(refused["RateLimit"].split(";t=")[1].split(",")[0])
    assert 0 < reset <= 3600 and int(refused["Retry-After"]) == reset


def test_an_override_sets_its_limit_in_the_policys_unit(client):
    from ratelimit_app.models import Override

    row = tokens_policy(limit=100)
    Override.objects.create(policy=row, kind="ip", network=IP, limit=5000)
    assert client.get("/llm/?used=4000", REMOTE_ADDR=IP).status_code == 200  # 4,000 tokens: beyond 100, within 5,000
    admitted = client.get("/llm/?used=991", REMOTE_ADDR=IP)
    assert admitted.status_code == 200 and '"llm-tokens";r=990;' in admitted["RateLimit"]  # 5,000 - 4,000 - 10
    assert client.get("/llm/?used=1", REMOTE_ADDR=IP).status_code == 429  # 4,991 + 10 > 5,000
    assert used_now() == 4991


def test_a_request_that_used_its_estimate_sends_no_settle(client, redis_client):
    from tests.helpers import server_commands_per_call

    tokens_policy(limit=10**9)
    make_policy(name="plain", action="plain", limit=10**9, window=3600, strategy="fixed_window")
    client.get("/llm/?used=10", REMOTE_ADDR=IP)  # loads the policies and the scripts
    client.get("/llm/plain/", REMOTE_ADDR=IP)

    def request(path):
        return lambda: client.get(path, REMOTE_ADDR=IP)

    unmetered = server_commands_per_call(redis_client, request("/llm/plain/"))
    as_estimated = server_commands_per_call(redis_client, request("/llm/?used=10"))  # the estimate: nothing differs
    differing = server_commands_per_call(redis_client, request("/llm/?used=11"))
    assert as_estimated == unmetered
    assert differing > unmetered  # a settle's EVAL, GET and INCRBY (the last may wait for the next call)
