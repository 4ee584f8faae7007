"""Import and export: a malformed file is refused with a message naming the row and field, and
changes nothing; a good one round-trips."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ratelimit_app.models import Override, Policy
from ratelimit_app.portable import import_data

pytestmark = pytest.mark.django_db

GOOD = {"name": "api", "action": "/api/", "limit": 10, "window": 60, "strategy": "fixed_window", "key": "ip"}
OVERRIDE = {"kind": "ip", "network": "10.0.0.0/8", "exempt": True}


def policy_file(*policies, **top):
    return {"format": "ratelimit_app/1", "policies": list(policies), **top}


def with_field(**changes):
    return policy_file({**GOOD, **changes})


def with_override(**changes):
    return policy_file({**GOOD, "overrides": [{**OVERRIDE, **changes}]})


@pytest.fixture
def existing():
    policy = Policy.objects.create(name="api", action="/api/", limit=5, window=60, strategy="fixed_window", key="ip")
    return policy


def run_import(tmp_path, content: str):
    source = tmp_path / "policies.json"
    source.write_text(content)
    call_command("ratelimit_import", str(source))


def state():
    return json.dumps(
        [list(Policy.objects.values().order_by("pk")), list(Override.objects.values().order_by("pk"))], default=str
    )


MALFORMED = [
    # (file content, words the message must contain)
    ('{"format": "ratelimit_app/1", "policies": [', "Not valid JSON"),
    ("", "Not valid JSON"),
    ("[]", "Not a ratelimit_app export"),
    ('{"policies": []}', "Not a ratelimit_app export"),
    (json.dumps({"format": "ratelimit_app/1", "policies": "api"}), "field 'policies': expected a list"),
    (json.dumps({"format": "ratelimit_app/1", "policies": [], "extra": 1}), "field 'extra': unknown field"),
    (json.dumps(policy_file("api")), "policy 1: expected an object"),
    (json.dumps(with_field(limit=99.99)), "policy 1 ('api'), field 'limit': expected a whole number, got the number 99.99"),
    (json.dumps(with_field(limit=True)), "field 'limit': expected a whole number, got true"),
    (json.dumps(with_field(limit="10")), "field 'limit': expected a whole number, got the text '10'"),
    (json.dumps(with_field(limit=None)), "field 'limit': expected a whole number, got null"),
    (json.dumps(with_field(limit=10**30)), "field 'limit': " + str(10**30) + " is out of range"),
    (json.dumps(with_field(limit=0)), "policy 1 ('api'): field 'limit'"),
    (json.dumps(with_field(limit=-3)), "field 'limit'"),
    (json.dumps(with_field(window=60.0)), "field 'window': expected a whole number"),
    ('{"format": "ratelimit_app/1", "policies": [{"name": "api", "action": "/api/", "limit": NaN, "window": 60, "strategy": "fixed_window", "key": "ip"}]}', "NaN is not a number JSON allows"),
    ('{"format": "ratelimit_app/1", "policies": [{"name": "api", "action": "/api/", "limit": Infinity, "window": 60, "strategy": "fixed_window", "key": "ip"}]}', "Infinity is not a number JSON allows"),
    ('{"format": "ratelimit_app/1", "policies": [{"name": "api", "name": "other", "action": "/api/", "limit": 1, "window": 60, "strategy": "fixed_window", "key": "ip"}]}', "'name' appears twice"),
    (json.dumps(with_field(enabled="yes")), "field 'enabled': expected true or false"),
    (json.dumps(with_field(enabled=1)), "field 'enabled': expected true or false"),
    (json.dumps(with_field(methods=["GET", "POST"])), "field 'methods': expected text, got a list"),
    (json.dumps(with_field(key=None)), "field 'key': expected text, got null"),
    (json.dumps(with_field(colour="red")), "policy 1 ('api'), field 'colour': unknown field"),
    (json.dumps(with_field(strategy="leaky_bucket")), "field 'strategy'"),
    (json.dumps(with_field(bucket_size=7.5, strategy="sliding_window")), "field 'bucket_size': expected a whole number or null"),
    (json.dumps(policy_file(GOOD, {**GOOD, "limit": 20})), "policy 2 ('api'), field 'name': the name is already used by policy 1"),
    (json.dumps(policy_file({k: v for k, v in GOOD.items() if k != "name"})), "policy 1, field 'name': required"),
    (json.dumps(policy_file({**GOOD, "overrides": {"kind": "ip"}})), "field 'overrides': expected a list, got an object"),
    (json.dumps(with_override(limit=2.5, exempt=False)), "override 1, field 'limit': expected a whole number or null"),
    (json.dumps(with_override(exempt="false")), "override 1, field 'exempt': expected true or false"),
    (json.dumps(with_override(when="now")), "override 1, field 'when': unknown field"),
    (json.dumps(with_override(expires_at="next tuesday")), "override 1: field 'expires_at'"),
    (json.dumps(with_override(expires_at="2030-13-45T00:00:00")), "override 1: field 'expires_at'"),
    (json.dumps(with_override(kind="header", header="X Api Key", value="abc", network="")), "override 1: field 'header': 'X Api Key' is not an HTTP header name"),
    (json.dumps(with_override(kind="user", user="nobody", network="")), "override 1: no user 'nobody'"),
    (json.dumps(with_override(network="not-an-ip")), "override 1: field 'network'"),
    (json.dumps(with_field(action="/api/\x00")), "policy 1 ('api'), field 'action': the text contains a NUL character"),
    (json.dumps(with_field(name="a\x00pi")), "field 'name': the text contains a NUL character"),
    (json.dumps(with_override(kind="user", user="no\x00body", network="")), "override 1, field 'user': the text contains a NUL character"),
    (json.dumps(policy_file(GOOD, costs=[{"action": "se\x00arch", "cost": 2}])), "cost 1 ('se\\x00arch'), field 'action': the text contains a NUL"),
    (json.dumps(with_field(limit=7)).replace('"limit": 7', '"limit": 1' + "0" * 4999), "policy 1 ('api'), field 'limit': a number of 5000 digits is out of range"),
    (json.dumps(with_field(name=7)).replace('"name": 7', '"name": ' + "9" * 5000), "policy 1, field 'name': expected text, got a number of 5000 digits"),
    (json.dumps(policy_file(GOOD, costs=[{"action": "search", "cost": 7}])).replace('"cost": 7', '"cost": -' + "9" * 6000), "cost 1 ('search'), field 'cost': a number of 6000 digits is out of range"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"format": "ratelimit_app/1", "policies": [' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "]}", "nested too deeply"),
]


@pytest.mark.parametrize("content, message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_a_malformed_file_is_refused_naming_row_and_field_and_changes_nothing(tmp_path, existing, content, message):
    before = state()
    with pytest.raises(CommandError) as refused:
        run_import(tmp_path, content)
    assert message in str(refused.value)
    assert state() == before


def test_a_good_row_beside_a_bad_one_is_not_imported_either(tmp_path, existing):
    content = json.dumps(policy_file({**GOOD, "limit": 50}, {**GOOD, "name": "other", "limit": 1.5}))
    with pytest.raises(CommandError, match="policy 2"):
        run_import(tmp_path, content)
    assert Policy.objects.get(name="api").limit == 5
    assert not Policy.objects.filter(name="other").exists()


def test_a_good_file_is_imported_with_its_overrides(tmp_path, existing):
    run_import(tmp_path, json.dumps(with_override(expires_at="2030-01-31T12:00:00+00:00")))
    policy = Policy.objects.get(name="api")
    assert policy.limit == 10
    [override] = policy.overrides.all()
    assert override.exempt and override.network == "10.0.0.0/8" and override.expires_at.year == 2030


def test_the_import_says_how_many_policies_and_overrides_in_good_english(tmp_path, capsys):
    run_import(tmp_path, json.dumps(with_override()))
    assert "Imported 1 policy, 1 override and 0 action costs." in capsys.readouterr().out
    run_import(tmp_path, json.dumps(policy_file(GOOD, {**GOOD, "name": "other"}, costs=[{"action": "/api/", "cost": 2}])))
    assert "Imported 2 policies, 0 overrides and 1 action cost." in capsys.readouterr().out


def test_a_file_that_gives_a_limit_without_a_unit_counts_requests_as_files_before_units_did():
    import_data({"format": "ratelimit_app/1", "policies": [
        {"name": "llm", "action": "/llm/", "rate": "20000/m", "strategy": "fixed_window", "unit": "tokens",
         "overage_cap": 500},
        {"name": "new", "action": "/new/", "limit": 5, "window": 60},
    ]})
    assert Policy.objects.get(name="new").unit == "requests"
    # an export of before units: its limit of 100 is 100 requests, not 100 tokens
    import_data({"format": "ratelimit_app/1", "policies": [{"name": "llm", "action": "/llm/", "limit": 100}]})
    llm = Policy.objects.get(name="llm")
    assert (llm.limit, llm.unit, llm.overage_cap) == (100, "requests", None)
    # an entry that changes no limit leaves the unit as it is
    Policy.objects.filter(name="llm").update(unit="tokens")
    import_data({"format": "ratelimit_app/1", "policies": [{"name": "llm", "mode": "shadow"}]})
    assert Policy.objects.get(name="llm").unit == "tokens"
