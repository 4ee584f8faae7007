"""Overrides: the most specific matching override sets the limit in effect; expired ones do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import RequestFactory
from django.utils import timezone

from ratelimit_app.models import Override, Policy
from ratelimit_app.overrides import matching_override
from ratelimit_app.policies import get_index

pytestmark = pytest.mark.django_db


@pytest.fixture
def policy():
    return Policy.objects.create(name="api", action="/api/", limit=10, window=60, strategy="fixed_window", key="user_or_ip")


@pytest.fixture
def alice():
    return User.objects.create_user("alice")


def request_from(ip="203.0.113.7", user=None, **headers):
    request = RequestFactory().get("/api/things/", REMOTE_ADDR=ip, **headers)
    request.user = user or AnonymousUser()
    return request


def in_effect(policy, request):
    found = matching_override(get_index().overrides.get(policy.id), request)
    if found is None:
        return policy.limit
    return "exempt" if found.exempt else found.limit


def test_no_override_means_the_policy_limit(policy):
    assert in_effect(policy, request_from()) == 10


def test_user_override_gives_that_user_its_limit(policy, alice):
    Override.objects.create(policy=policy, kind="user", user=alice, limit=1000)
    assert in_effect(policy, request_from(user=alice)) == 1000
    assert in_effect(policy, request_from(user=User.objects.create_user("bob"))) == 10


def test_network_override_matches_every_address_inside(policy):
    Override.objects.create(policy=policy, kind="ip", network="10.1.0.0/16", exempt=True)
    assert in_effect(policy, request_from("10.1.200.3")) == "exempt"
    assert in_effect(policy, request_from("10.2.0.1")) == 10


def test_exact_address_wins_over_its_network(policy):
    Override.objects.create(policy=policy, kind="ip", network="10.1.0.0/16", limit=100)
    Override.objects.create(policy=policy, kind="ip", network="10.1.0.9", limit=5)
    assert in_effect(policy, request_from("10.1.0.9")) == 5
    assert in_effect(policy, request_from("10.1.0.10")) == 100


def test_narrower_network_wins_over_wider(policy):
    Override.objects.create(policy=policy, kind="ip", network="10.0.0.0/8", limit=100)
    Override.objects.create(policy=policy, kind="ip", network="10.1.0.0/16", limit=50)
    assert in_effect(policy, request_from("10.1.2.3")) == 50
    assert in_effect(policy, request_from("10.9.2.3")) == 100


def test_user_wins_over_group_and_network(policy, alice):
    staff = Group.objects.create(name="partners")
    alice.groups.add(staff)
    Override.objects.create(policy=policy, kind="group", group=staff, limit=500)
    Override.objects.create(policy=policy, kind="ip", network="203.0.113.0/24", limit=300)
    assert in_effect(policy, request_from(user=alice)) == 300  # network before group
    Override.objects.create(policy=policy, kind="user", user=alice, limit=7)
    assert in_effect(policy, request_from(user=alice)) == 7


def test_group_override_follows_membership_changes(policy, alice):
    partners = Group.objects.create(name="partners")
    Override.objects.create(policy=policy, kind="group", group=partners, limit=500)
    assert in_effect(policy, request_from(user=alice)) == 10
    alice.groups.add(partners)
    assert in_effect(policy, request_from(user=alice)) == 500


def test_header_value_override_matches_an_api_key(policy):
    Override.objects.create(policy=policy, kind="header", header="X-Api-Key", value="k-partner-123", limit=5000)
    assert in_effect(policy, request_from(HTTP_X_API_KEY="k-partner-123")) == 5000
    assert in_effect(policy, request_from(HTTP_X_API_KEY="k-other")) == 10


def test_expired_override_no_longer_applies_and_the_next_one_does(policy):
    Override.objects.create(policy=policy, kind="ip", network="203.0.113.0/24", limit=300)
    Override.objects.create(
        policy=policy, kind="ip", network="203.0.113.7", limit=3, expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert in_effect(policy, request_from()) == 300


EXPIRED = {"expires_at": timezone.now() - timedelta(seconds=1)}


@pytest.mark.parametrize(
    "matcher, request_kwargs",
    [
        ({"kind": "ip", "network": "203.0.113.7"}, {}),
        ({"kind": "header", "header": "X-Api-Key", "value": "k-partner-123"}, {"HTTP_X_API_KEY": "k-partner-123"}),
        ({"kind": "user"}, {"user": True}),
    ],
    ids=["address", "header", "user"],
)
def test_an_expired_override_never_hides_an_active_one_for_the_same_subject(policy, alice, matcher, request_kwargs):
    if matcher["kind"] == "user":
        matcher = {**matcher, "user": alice}
        request_kwargs = {"user": alice}
    Override.objects.create(policy=policy, limit=1000, **matcher)  # active, the older row
    Override.objects.create(policy=policy, limit=1, **matcher, **EXPIRED)  # expired, loaded last
    assert in_effect(policy, request_from(**request_kwargs)) == 1000


@pytest.mark.parametrize(
    "address, setting, value",
    [("2001:db8::1", "RATELIMIT_IPV6_PREFIX", 64), ("198.51.100.7", "RATELIMIT_IPV4_PREFIX", 24)],
)
def test_an_address_override_matches_its_client_when_policies_group_addresses(policy, settings, address, setting, value):
    setattr(settings, setting, value)
    Override.objects.create(policy=policy, kind="ip", network=address, limit=1000)
    assert in_effect(policy, request_from(address)) == 1000
    neighbour = address[:-1] + "9"  # same group, another client
    assert in_effect(policy, request_from(neighbour)) == 10


HEADER_WINNER = """
import django, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()
from django.test import RequestFactory
from ratelimit_app.models import Override
from ratelimit_app.overrides import compile_overrides, matching_override
rows = [Override(pk=1 + i, policy_id=1, kind="header", header=name, value="v", limit=1 + i)
        for i, name in enumerate(["X-Partner", "X-Api-Key", "X-Client-Id", "X-Tenant", "Authorization"])]
request = RequestFactory().get("/", HTTP_X_PARTNER="v", HTTP_X_API_KEY="v", HTTP_X_CLIENT_ID="v", HTTP_X_TENANT="v", HTTP_AUTHORIZATION="v")
print(matching_override(compile_overrides(rows, {})[1], request).limit)
"""


def test_which_header_override_wins_does_not_depend_on_the_process():
    winners = set()
    for seed in range(4):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        done = subprocess.run([sys.executable, "-c", HEADER_WINNER], env=env, capture_output=True, text=True, check=True)
        winners.add(done.stdout.strip())
    assert winners == {"1"}  # the older row, in every process


def test_override_expiring_later_applies_until_then(policy):
    Override.objects.create(policy=policy, kind="ip", network="203.0.113.7", limit=3, expires_at=timezone.now() + timedelta(hours=1))
    assert in_effect(policy, request_from()) == 3


def test_overrides_are_read_from_the_index_without_queries(policy, alice, django_assert_num_queries):
    Override.objects.create(policy=policy, kind="user", user=alice, limit=1000)
    get_index()
    with django_assert_num_queries(0):
        assert in_effect(policy, request_from(user=alice)) == 1000


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"kind": "user", "limit": 5}, "user", "Required"),
        ({"kind": "ip", "network": "10.0.0.300", "limit": 5}, "network", "CIDR"),
        ({"kind": "ip", "network": "10.0.0.1", "limit": 5, "exempt": True}, "limit", "exempt"),
        ({"kind": "ip", "network": "10.0.0.1"}, "limit", "Give a limit"),
        ({"kind": "header", "header": "X-Api-Key", "limit": 5}, "value", "Required"),
    ],
)
def test_invalid_overrides_are_refused_with_a_message(policy, fields, field, message):
    with pytest.raises(ValidationError) as refused:
        Override(policy=policy, **fields).full_clean()
    assert message in " ".join(refused.value.message_dict[field])


def test_networks_are_stored_in_canonical_form(policy):
    override = Override(policy=policy, kind="ip", network="10.1.2.3/16", limit=5)
    override.full_clean()
    assert override.network == "10.1.0.0/16"


def test_export_then_import_reproduces_policies_and_overrides(policy, alice, tmp_path):
    Override.objects.create(policy=policy, kind="user", user=alice, limit=1000, reason="partner")
    Override.objects.create(policy=policy, kind="ip", network="10.0.0.0/8", exempt=True)
    exported = tmp_path / "policies.json"
    call_command("ratelimit_export", str(exported))
    before = json.loads(exported.read_text())
    Policy.objects.all().delete()
    call_command("ratelimit_import", str(exported))
    again = tmp_path / "again.json"
    call_command("ratelimit_export", str(again))
    assert json.loads(again.read_text()) == before
    assert Policy.objects.get(name="api").overrides.get(kind="user").user == alice


def test_import_with_a_bad_row_changes_nothing(policy, tmp_path):
    bad = {
        "format": "ratelimit_app/1",
        "policies": [
            {"name": "api", "action": "/api/", "limit": 99, "window": 60, "strategy": "fixed_window", "key": "ip"},
            {"name": "broken", "action": "*", "limit": 0, "window": 60, "strategy": "fixed_window", "key": "ip"},
        ],
    }
    source = tmp_path / "bad.json"
    source.write_text(json.dumps(bad))
    with pytest.raises(CommandError, match="broken"):
        call_command("ratelimit_import", str(source))
    assert Policy.objects.get(name="api").limit == 10
    assert not Policy.objects.filter(name="broken").exists()


# --- IPv4-mapped IPv6 addresses (::ffff:203.0.113.7) are the IPv4 clients they carry -------------


@pytest.fixture
def search_policy():
    return Policy.objects.create(name="search", action="demo:search", limit=1, window=60, strategy="fixed_window", key="ip")


def searches(client, remote_addr: str, times: int = 3) -> list[int]:
    return [client.get("/demo/search/?q=a", REMOTE_ADDR=remote_addr).status_code for _ in range(times)]


@pytest.mark.parametrize("network", ["::ffff:203.0.113.7", "::ffff:cb00:7107", "::ffff:203.0.113.0/120"])
@pytest.mark.parametrize("remote_addr", ["203.0.113.7", "::ffff:203.0.113.7"])
def test_an_override_written_as_an_ipv4_mapped_address_exempts_that_client(client, search_policy, network, remote_addr):
    override = Override(policy=search_policy, kind="ip", network=network, exempt=True)
    override.full_clean()  # as the admin and the import save it
    override.save()
    assert searches(client, remote_addr) == [200, 200, 200]
    assert searches(client, "198.51.100.2") == [200, 429, 429]  # everyone else is still limited


def test_ipv4_mapped_overrides_are_stored_as_the_ipv4_they_carry(policy):
    for written, stored in [("::ffff:203.0.113.7", "203.0.113.7"), ("::ffff:203.0.113.9/120", "203.0.113.0/24"),
                            ("2001:db8::1", "2001:db8::1"), ("::/0", "::/0")]:
        override = Override(policy=policy, kind="ip", network=written, limit=5)
        override.full_clean()
        assert override.network == stored, written


def test_an_ipv4_mapped_override_saved_before_this_release_still_matches(client, search_policy):
    # rows written by an earlier version keep the mapped form: the index normalises them too
    Override.objects.create(policy=search_policy, kind="ip", network="::ffff:cb00:7107", exempt=True)
    assert searches(client, "203.0.113.7") == [200, 200, 200]


def test_an_ipv4_mapped_trusted_proxy_is_trusted(client, search_policy, settings):
    settings.RATELIMIT_TRUSTED_PROXIES = ["::ffff:10.0.0.1"]
    first = client.get("/demo/search/?q=a", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7")
    second = client.get("/demo/search/?q=a", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.2")
    assert (first.status_code, second.status_code) == (200, 200)  # two clients, not one proxy
