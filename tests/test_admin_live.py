"""The live page: subjects of the current window, busiest first, as HTML and JSON; reset; permissions."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from ratelimit_app import engine
from ratelimit_app.models import Override, Policy
from ratelimit_app.policies import compile_policy
from tests.helpers import make_policy

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
        "strategy": "sliding_window", "key": "ip", "mode": "enforce",
    }
    [subject] = data["subjects"]
    assert {k: subject[k] for k in ("subject", "count", "limit", "remaining", "blocked")} == {
        "subject": f"ip:{IP}", "count": 3, "limit": 3, "remaining": 0, "blocked": True,
    }
    assert 0 < subject["reset_in"] <= 60
    assert data["totals"] == {"allowed": 3, "denied": 1}


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
