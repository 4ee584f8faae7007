"""The live page: subjects of the current window, busiest first, as HTML and JSON; reset; permissions."""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from typing import Iterator

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from ratelimit_app import engine, live
from ratelimit_app.models import Override, Policy
from ratelimit_app.policies import compile_policy
from tests.helpers import check, make_policy

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"


@pytest.fixture
def policy():
    return make_policy(name="search-per-ip", action="demo:search", limit=3, window=60, strategy="sliding_window", key="ip")


def live_url(policy):
    return reverse("admin:ratelimit_app_policy_live", args=[policy.pk])


def reset_url(policy):
    return reverse("admin:ratelimit_app_policy_reset", args=[policy.pk])


def search(client, ip=IP, times=1):
    return [client.get("/demo/search/?q=a", REMOTE_ADDR=ip).status_code for _ in range(times)]


def test_json_has_the_documented_shape_after_real_requests(admin_client, client, policy):
    search(client, times=4)
    data = admin_client.get(live_url(policy) + "?format=json").json()
    assert data["policy"] == {
        "id": policy.pk, "name": "search-per-ip", "action": "demo:search", "limit": 3, "window": 60,
        "strategy": "sliding_window", "key": "ip", "mode": "enforce", "unit": "requests",
    }
    [subject] = data["subjects"]
    assert {k: subject[k] for k in ("subject", "count", "limit", "remaining", "blocked", "overage")} == {
        "subject": f"ip:{IP}", "count": 3, "limit": 3, "remaining": 0, "blocked": True, "overage": 0,
    }
    assert 0 < subject["reset_in"] <= 60
    assert data["totals"] == {"allowed": 3, "denied": 1}


def test_a_policy_in_tokens_shows_its_limit_its_plans_and_its_column_in_tokens(admin_client):
    from ratelimit_app.models import Plan, PlanLimit

    tokens = make_policy(name="chat-month", action="chat", limit=10_000_000, strategy="calendar_quota",
                         period="month", key="ip", unit="tokens")
    PlanLimit.objects.create(plan=Plan.objects.create(name="pro"), policy=tokens, limit=50_000_000)
    assert engine.decide([check(compile_policy(tokens), f"ip:{IP}")], cost=7_412_009).allowed
    page = admin_client.get(live_url(tokens)).content.decode()
    assert "10,000,000 tokens / calendar month (UTC)" in page  # the summary line
    assert ">pro</a>: 50,000,000 tokens / calendar month (UTC)</li>" in page
    assert '<th class="num">tokens</th>' in page
    data = admin_client.get(live_url(tokens) + "?format=json").json()
    assert data["policy"]["unit"] == "tokens"
    assert {k: data["subjects"][0][k] for k in ("count", "limit", "remaining", "overage")} == {
        "count": 7_412_009, "limit": 10_000_000, "remaining": 2_587_991, "overage": 0,
    }


def test_a_subject_in_debt_after_a_settle_is_blocked_with_its_overage(admin_client):
    from tests.helpers import settled

    tokens = make_policy(name="chat-minute", action="chat", limit=1000, window=60, key="ip", unit="tokens")
    settled(compile_policy(tokens), f"ip:{IP}", used=1500, estimate=100)
    [subject] = admin_client.get(live_url(tokens) + "?format=json").json()["subjects"]
    assert {k: subject[k] for k in ("count", "limit", "remaining", "blocked", "overage")} == {
        "count": 1500, "limit": 1000, "remaining": 0, "blocked": True, "overage": 500,
    }


def test_subjects_are_listed_busiest_first(admin_client, client, policy):
    search(client, "198.51.100.1", 1)
    search(client, "198.51.100.2", 3)
    search(client, "198.51.100.3", 2)
    subjects = admin_client.get(live_url(policy) + "?format=json").json()["subjects"]
    assert [s["subject"] for s in subjects] == ["ip:198.51.100.2", "ip:198.51.100.3", "ip:198.51.100.1"]
    assert [s["blocked"] for s in subjects] == [True, False, False]


def test_thousands_of_subjects_show_the_top_rows_and_the_total(admin_client, policy):
    compiled = compile_policy(policy)
    from tests.helpers import check

    for i in range(1500):
        engine.decide([check(compiled, f"ip:10.0.{i // 250}.{i % 250}")])
    data = admin_client.get(live_url(policy) + "?format=json").json()
    assert data["active"] == 1500
    assert len(data["subjects"]) == 100
    assert len(admin_client.get(live_url(policy) + "?format=json&limit=20").json()["subjects"]) == 20


def test_live_page_renders_with_the_admin_look(admin_client, client, policy):
    search(client)
    page = admin_client.get(live_url(policy))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Live usage: search-per-ip" in html
    assert 'id="rl-subjects"' in html and "refresh().finally(schedule)" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # no external assets


def test_overridden_subjects_show_their_own_limit(admin_client, client, policy):
    Override.objects.create(policy=policy, kind="ip", network=IP, limit=10, reason="partner")
    search(client, times=4)
    [subject] = admin_client.get(live_url(policy) + "?format=json").json()["subjects"]
    assert (subject["count"], subject["limit"], subject["overridden"], subject["blocked"]) == (4, 10, True, False)


def test_exempt_overrides_are_listed_on_the_page(admin_client, policy):
    Override.objects.create(policy=policy, kind="ip", network="10.0.0.0/8", exempt=True, reason="office")
    assert "ip 10.0.0.0/8" in admin_client.get(live_url(policy)).content.decode()


def test_shadow_policy_shows_what_it_would_have_denied(admin_client, client, policy):
    policy.mode = "shadow"
    policy.save()
    assert search(client, times=5) == [200] * 5
    data = admin_client.get(live_url(policy) + "?format=json").json()
    assert data["totals"] == {"allowed": 3, "denied": 2}
    assert data["subjects"][0]["blocked"] is True
    assert "would have denied" in admin_client.get(live_url(policy)).content.decode()


def test_reset_one_subject(admin_client, client, policy):
    search(client, IP, 3)
    search(client, "198.51.100.9", 3)
    subjects = admin_client.get(live_url(policy) + "?format=json").json()["subjects"]
    key = next(s["key"] for s in subjects if s["subject"] == f"ip:{IP}")
    response = admin_client.post(reset_url(policy), {"subject": key}, follow=True)
    assert response.redirect_chain[-1][0] == live_url(policy)
    assert "reset" in [str(m) for m in response.context["messages"]][0]
    assert search(client, IP) == [200]
    assert search(client, "198.51.100.9") == [429]


def test_reset_all_subjects(admin_client, client, policy):
    search(client, IP, 3)
    search(client, "198.51.100.9", 3)
    admin_client.post(reset_url(policy))
    assert search(client, IP) == [200]
    assert search(client, "198.51.100.9") == [200]
    assert admin_client.get(live_url(policy) + "?format=json").json()["active"] == 2


def test_reset_of_something_that_is_neither_a_subject_key_nor_a_subject_is_refused(admin_client, client, policy):
    search(client, times=3)
    response = admin_client.post(reset_url(policy), {"subject": "../*"}, follow=True)
    assert "is not a subject of the key 'ip'" in [str(m) for m in response.context["messages"]][0]
    assert search(client) == [429]


def test_resets_appear_in_the_changes_log(admin_client, client, policy):
    search(client)
    [subject] = admin_client.get(live_url(policy) + "?format=json").json()["subjects"]
    admin_client.post(reset_url(policy), {"subject": subject["key"], "display": subject["subject"]})
    admin_client.post(reset_url(policy))
    changes = admin_client.get(reverse("admin:ratelimit_app_policy_changes")).content.decode()
    assert f"Counts of subject ip:{IP} reset for search-per-ip." in changes
    assert "Counts of every subject reset for search-per-ip." in changes


def test_reset_requires_csrf(admin_user, policy):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    assert browser.post(reset_url(policy)).status_code == 403
    assert Policy.objects.get(pk=policy.pk).generation == 0


def test_reset_by_get_changes_nothing(admin_client, policy):
    assert admin_client.get(reset_url(policy)).status_code == 302
    assert Policy.objects.get(pk=policy.pk).generation == 0


def test_anonymous_users_go_to_the_admin_login(client, policy):
    response = client.get(live_url(policy))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert client.post(reset_url(policy)).status_code == 302
    assert Policy.objects.get(pk=policy.pk).generation == 0


def test_staff_without_view_permission_get_403(client, policy):
    client.force_login(User.objects.create_user("staff", is_staff=True))
    assert client.get(live_url(policy)).status_code == 403
    assert client.get(live_url(policy) + "?format=json").status_code == 403


def test_view_permission_can_look_but_not_reset(client, policy):
    staff = User.objects.create_user("viewer", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_policy"))
    client.force_login(staff)
    page = client.get(live_url(policy))
    assert page.status_code == 200 and "Reset all subjects" not in page.content.decode()
    assert client.post(reset_url(policy)).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="change_policy"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.post(reset_url(policy)).status_code == 302


def test_unreachable_redis_is_stated_not_raised(admin_client, policy, settings):
    settings.CACHES = {**settings.CACHES, "dead": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    settings.RATELIMIT_CACHE = "dead"
    response = admin_client.get(live_url(policy) + "?format=json")
    assert response.status_code == 503
    assert "Redis is unreachable" in response.json()["error"]
    page = admin_client.get(live_url(policy))
    assert page.status_code == 503 and "Redis is unreachable" in page.content.decode()
    assert admin_client.get("/admin/ratelimit_app/policy/").status_code == 200


# --- the operator's reads never hurt enforcement -------------------------------------------------

T0 = 1_800_000_000.0  # a window boundary


def decide_at(compiled, who, now, times=1):
    return [engine.decide([check(compiled, who)], now=now).allowed for _ in range(times)]


ARGUMENT = re.compile(r'"((?:[^"\\]|\\.)*)"')
SCRIPT_CALLS = ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO")


@contextlib.contextmanager
def calls_run() -> Iterator[list[list[list[str]]]]:
    """What the server runs while the block runs (MONITOR), call by call: a command a client sent, or
    every command one script (or function) call ran; each command as its arguments."""
    calls: list[list[list[str]]] = []
    watcher = redis.Redis.from_url(os.environ["REDIS_URL"])
    end = f"end-of-block-{os.getpid()}"
    with watcher.monitor() as monitor:
        yield calls
        watcher.echo(end)  # after the block's commands in the monitor's stream
        in_script = False
        while True:
            line = monitor.connection.read_response()
            line = line.decode() if isinstance(line, bytes) else line
            command = ARGUMENT.findall(line)
            if command == ["ECHO", end]:
                break
            from_script = " lua]" in line
            if from_script and in_script:
                calls[-1].append(command)
            elif from_script:
                calls.append([command])
            elif command[0].upper() not in SCRIPT_CALLS:  # a script call's own line: its commands follow
                calls.append([command])
            in_script = from_script
    watcher.close()


def items_read(command: list[str]) -> float:
    """Fields, keys or members one command names or walks (a range open at one end: all of them)."""
    name, upper = command[0].upper(), [part.upper() for part in command]
    if name in ("HMGET", "HDEL"):
        return len(command) - 2
    if name in ("MGET", "DEL", "EXISTS"):
        return len(command) - 1
    if "LIMIT" in upper:
        at = upper.index("LIMIT")
        return int(command[at + 1]) + int(command[at + 2])
    if name in ("ZRANGEBYSCORE", "ZREVRANGEBYSCORE") or "BYSCORE" in upper:
        return math.inf
    if name in ("ZRANGE", "ZREVRANGE", "LRANGE"):
        start, stop = int(command[2]), int(command[3])
        return stop - start + 1 if (start < 0) == (stop < 0) else math.inf
    if name in ("HGETALL", "HKEYS", "HVALS", "SMEMBERS", "KEYS", "SCAN"):
        return math.inf
    return 1


@pytest.mark.parametrize(
    "fields, subjects, seconds, read_at",
    [
        ({"strategy": "sliding_window", "window": 600, "bucket_size": 1}, 150, 120, 660),
        ({"strategy": "fixed_window", "window": 600}, 3000, 1, 300),
        ({"strategy": "sliding_log", "window": 600, "limit": 1000}, 300, 60, 630),
    ],
    ids=["sliding_window-600-buckets", "fixed_window-3000-subjects", "sliding_log"],
)
def test_every_admin_call_reads_a_bounded_number_of_items_whatever_the_subjects_and_buckets(settings, fields, subjects, seconds, read_at):
    settings.RATELIMIT_LIVE_INDEX_SIZE = 3000
    compiled = compile_policy(make_policy(**{"limit": 10_000, **fields}))
    for second in range(seconds):  # a request per second and subject: one filled bucket each
        for i in range(subjects):
            engine.decide([check(compiled, f"ip:10.{i // 250}.{i % 250}.1")], now=T0 + second)
    # At read_at about half the buckets have left the window: the reads must subtract them. Bounded is
    # counted in items: every call, a script's with all the commands it runs, reads at most so many.
    with calls_run() as calls:
        usage = live.live_usage(compiled, now=T0 + read_at)
        live.policy_activity([Policy.objects.get(pk=compiled.id)])
    read = [(" ".join(call[0])[:80], sum(map(items_read, call)), len(call)) for call in calls]
    assert sum(len(call) > 1 for call in calls) >= 2  # scripts read the totals and the counters: counted inside
    assert [(first, n) for first, n, _ in read if n > 2 * live.FIELD_BUDGET] == []
    assert len(usage.subjects) == subjects
    expected = engine.decide([check(compiled, "ip:10.0.0.1")], now=T0 + read_at, dry_run=True).decisions[0].count
    assert expected > 0 and {s.count for s in usage.subjects} == {expected}


@pytest.fixture
def paused_redis():
    """Redis answers nobody for 1.5 s (CLIENT PAUSE), as a server stalled by a long command would."""
    patient = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=10)

    def pause():
        patient.execute_command("CLIENT", "PAUSE", 1500)

    yield pause
    patient.execute_command("CLIENT", "UNPAUSE")
    patient.close()


def test_a_stalled_admin_read_never_opens_the_request_paths_breaker(admin_client, client, policy, settings, paused_redis):
    settings.RATELIMIT_ADMIN_TIMEOUT = 0.2
    search(client)
    failures = engine.breaker.failures
    paused_redis()
    response = admin_client.get(live_url(policy) + "?format=json")
    assert response.status_code == 503 and "Redis is unreachable" in response.json()["error"]
    listing = admin_client.get("/admin/ratelimit_app/policy/")
    assert listing.status_code == 200 and "Redis is unreachable" in listing.content.decode()
    assert engine.breaker.failures == failures and not engine.breaker.open_until


def test_totals_and_subjects_describe_the_same_window_on_sliding_policies(admin_client, policy):
    compiled = compile_policy(policy)  # sliding_window, 3 per 60 s
    assert decide_at(compiled, "ip:198.51.100.1", T0 + 50, times=4) == [True, True, True, False]
    usage = live.live_usage(compiled, now=T0 + 70)  # a new minute: the fixed minute's totals would be 0
    [subject] = usage.subjects
    assert (subject.count, usage.allowed, usage.denied) == (3, 3, 1)
    assert live.live_usage(compiled, now=T0 + 111).subjects == []  # the buckets of T0+50 left at T0+110
    assert live.live_usage(compiled, now=T0 + 111)[:3] == (0, 0, 0)


@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_log"])
def test_totals_match_the_sum_of_the_subjects(strategy):
    compiled = compile_policy(make_policy(name="p", strategy=strategy, limit=5, window=60))
    for i, when in enumerate([1, 7, 13, 29, 31, 44, 58, 59]):
        decide_at(compiled, f"ip:198.51.100.{i % 3}", T0 + when, times=i % 4 + 1)
    for moment in (T0 + 59, T0 + 61, T0 + 90, T0 + 119):  # requests at whole seconds: on bucket edges
        usage = live.live_usage(compiled, now=moment)
        assert usage.allowed == sum(s.count for s in usage.subjects), moment
        assert usage.active == len(usage.subjects), moment


def test_blocked_subjects_are_never_evicted_and_the_page_says_how_many_are_active(admin_client, policy, settings):
    settings.RATELIMIT_LIVE_INDEX_SIZE = 10
    compiled = compile_policy(policy)
    decide_at(compiled, "ip:203.0.113.66", T0, times=4)  # blocked
    for i in range(25):
        decide_at(compiled, f"ip:10.0.0.{i}", T0 + 1)
    usage = live.live_usage(compiled, now=T0 + 2)
    assert "ip:203.0.113.66" in [s.display for s in usage.subjects]
    assert usage.subjects[0].display == "ip:203.0.113.66" and usage.subjects[0].count == 3
    assert (len(usage.subjects), usage.active, usage.index_full) == (10, 26, True)


def test_the_page_says_shown_of_about_active_when_the_index_is_full(admin_client, policy, settings):
    settings.RATELIMIT_LIVE_INDEX_SIZE = 10
    for i in range(25):
        search(Client(), f"10.0.0.{i}")
    data = admin_client.get(live_url(policy) + "?format=json").json()
    assert (data["shown"], data["active"]) == (10, 25)
    assert "10 shown of about 25" in admin_client.get(live_url(policy)).content.decode()


def test_a_subject_whose_counter_lives_stays_listed_on_the_real_clock(policy):
    # sliding_log over 1 s: the index used to expire 2 windows after its last new subject
    compiled = compile_policy(make_policy(name="log", strategy="sliding_log", limit=100, window=1))
    started = time.monotonic()
    for moment in (0.0, 0.5, 1.0, 1.5, 1.9):
        time.sleep(max(0.0, started + moment - time.monotonic()))
        assert engine.decide([check(compiled, "ip:198.51.100.5")]).allowed
    time.sleep(max(0.0, started + 2.3 - time.monotonic()))
    [subject] = live.live_usage(compiled).subjects
    assert subject.display == "ip:198.51.100.5" and subject.count >= 1


def test_a_row_with_window_0_shows_as_invalid_on_the_list_and_the_live_page(admin_client, policy):
    Policy.objects.filter(pk=policy.pk).update(window=0)  # as raw SQL would
    listing = admin_client.get("/admin/ratelimit_app/policy/")
    assert listing.status_code == 200 and "invalid" in listing.content.decode()
    data = admin_client.get(live_url(policy) + "?format=json").json()
    assert "This policy is invalid and not enforced" in data["error"]
    assert admin_client.get(live_url(policy)).status_code == 200


def test_the_reset_log_names_the_subject_as_the_server_knows_it(admin_client, client, policy):
    search(client)
    [subject] = admin_client.get(live_url(policy) + "?format=json").json()["subjects"]
    admin_client.post(reset_url(policy), {"subject": subject["key"], "display": "ip:1.2.3.4 (forged)"})
    changes = admin_client.get(reverse("admin:ratelimit_app_policy_changes")).content.decode()
    assert f"Counts of subject ip:{IP} reset for search-per-ip." in changes
    assert "forged" not in changes


def test_activity_is_read_on_the_servers_clock(policy, monkeypatch):
    compiled = compile_policy(policy)
    engine.decide([check(compiled)])
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # this process's clock is far off
    assert live.policy_activity([policy])[policy.pk].allowed == 1


def test_the_live_page_reloads_its_scripts_after_script_flush(admin_client, client, policy, redis_client, settings):
    settings.RATELIMIT_REDIS_FUNCTIONS = False  # EVALSHA; FUNCTION FLUSH: tests/test_scripts.py, on a server of its own
    search(client, times=2)
    assert admin_client.get(live_url(policy) + "?format=json").json()["subjects"][0]["count"] == 2
    redis_client.script_flush()
    data = admin_client.get(live_url(policy) + "?format=json").json()
    assert data["subjects"][0]["count"] == 2 and data["totals"]["allowed"] == 2


def test_a_full_index_keeps_the_busiest_subjects_and_evicts_the_quietest(settings):
    """Among subjects whose counters empty together (a fixed window), a full index drops the quietest."""
    settings.RATELIMIT_LIVE_INDEX_SIZE = 10
    compiled = compile_policy(make_policy(name="fixed", action="demo:search", limit=3, window=60, strategy="fixed_window"))
    busy = [f"ip:192.0.2.{i}" for i in range(3)]
    for who in busy:
        decide_at(compiled, who, T0, times=2)  # at the limit of 3 per window, not over it
    for i in range(40):  # quieter subjects arriving afterwards, in the same window
        decide_at(compiled, f"ip:10.0.1.{i}", T0 + 1)
    listed = [s.display for s in live.live_usage(compiled, now=T0 + 2).subjects]
    assert set(busy) <= set(listed)  # the busiest are what the page is for
