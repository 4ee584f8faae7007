"""The policy admin's extra pages are views of their own that ask the policy admin for permissions: a
page that only looks needs the view permission, one that changes counts or values the change permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from ratelimit_app.models import Policy, Source
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

CODE_VALUES = ("action", "key", "methods", "limit", "window", "strategy", "bucket_size", "burst", "period",
               "time_zone", "mode", "enabled")


@pytest.fixture
def policy():
    """A policy declared in code whose limit an operator changed from 10 to 99."""
    row = make_policy(name="from-code", action="demo:search", source=Source.CODE)
    Policy.objects.filter(pk=row.pk).update(code_values={field: getattr(row, field) for field in CODE_VALUES}, limit=99)
    return Policy.objects.get(pk=row.pk)


def looking(policy) -> list[str]:
    return [
        reverse("admin:ratelimit_app_policy_live", args=[policy.pk]),
        reverse("admin:ratelimit_app_policy_live", args=[policy.pk]) + "?format=json",
        reverse("admin:ratelimit_app_policy_tester"),
        reverse("admin:ratelimit_app_policy_changes"),
    ]


def changing(policy) -> list[str]:
    return [
        reverse("admin:ratelimit_app_policy_reset", args=[policy.pk]),
        reverse("admin:ratelimit_app_policy_revert", args=[policy.pk]),
    ]


def staff(client, *permissions: str) -> User:
    user = User.objects.create_user("operator", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=permissions))
    client.force_login(user)
    return user


def test_the_pages_keep_their_addresses(policy):
    base = f"/admin/ratelimit_app/policy/{policy.pk}"
    assert [url.split("?")[0] for url in looking(policy)] == [
        f"{base}/live/", f"{base}/live/", "/admin/ratelimit_app/policy/tester/", "/admin/ratelimit_app/policy/changes/",
    ]
    assert changing(policy) == [f"{base}/live/reset/", f"{base}/revert/"]


def test_staff_without_the_view_permission_open_none_of_them(client, policy):
    staff(client)
    assert [client.get(url).status_code for url in looking(policy)] == [403] * 4
    assert [client.post(url).status_code for url in changing(policy)] == [403] * 2


def test_the_view_permission_opens_what_only_looks(client, policy):
    staff(client, "view_policy")
    assert [client.get(url).status_code for url in looking(policy)] == [200] * 4
    assert [client.post(url).status_code for url in changing(policy)] == [403] * 2
    policy.refresh_from_db()
    assert (policy.generation, policy.limit) == (0, 99)


def test_the_change_permission_resets_and_reverts(client, policy):
    staff(client, "view_policy", "change_policy")
    reset, revert = changing(policy)
    assert client.post(reset).url == reverse("admin:ratelimit_app_policy_live", args=[policy.pk])
    assert client.post(revert).url == reverse("admin:ratelimit_app_policy_change", args=[policy.pk])
    policy.refresh_from_db()
    assert (policy.generation, policy.limit) == (1, 10)


def test_an_unknown_policy_is_not_found(admin_client):
    missing = Policy(pk=987654)
    assert admin_client.get(looking(missing)[0]).status_code == 404
    assert [admin_client.post(url).status_code for url in changing(missing)] == [404] * 2
