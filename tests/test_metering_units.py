"""A policy's unit: requests (the default), content-bytes, or a unit the view reports; refused, with the
reason, where the strategy cannot count it (the model's validation, the system check, the import)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.test import override_settings

from ratelimit_app import portable, registry, strategies
from ratelimit_app.registry.declarations import settings_policies
from ratelimit_app.decorators import ratelimit
from ratelimit_app.loading import compile_policy
from ratelimit_app.models import Policy
from ratelimit_app.portable import ImportRefused

pytestmark = pytest.mark.django_db


def row(**values) -> Policy:
    return Policy(**{"name": "llm", "action": "/llm/", "limit": 20_000, "window": 60, "key": "ip", **values})


def test_a_policy_counts_requests_unless_told():
    policy = row(strategy="fixed_window")
    policy.full_clean()
    assert policy.unit == "requests" and compile_policy(policy).unit == "requests"


@pytest.mark.parametrize("unit", ["tokens", "content-bytes", "credits", "gpu-seconds"])
@pytest.mark.parametrize("strategy", ["fixed_window", "sliding_window", "token_bucket"])
def test_strategies_that_count_units_take_a_metered_unit(strategy, unit):
    policy = row(strategy=strategy, unit=unit)
    policy.full_clean()
    assert compile_policy(policy).unit == unit


def test_a_calendar_quota_takes_a_metered_unit():
    policy = row(strategy="calendar_quota", limit=10_000_000, window=31 * 86400, period="month", unit="tokens")
    policy.full_clean()
    assert compile_policy(policy).unit == "tokens"


@pytest.mark.parametrize("unit", ["Tokens", "to kens", "-tokens", "t" * 33, "tökens"])
def test_a_malformed_unit_is_refused_with_what_a_unit_is(unit):
    with pytest.raises(ValidationError) as refused:
        row(strategy="fixed_window", unit=unit).full_clean()
    assert "A unit is 'requests', 'content-bytes'" in " ".join(refused.value.message_dict["unit"])


@pytest.mark.parametrize(("strategy", "reason"), [
    ("sliding_log", "it keeps one entry per unit"),
    ("concurrency", "it counts the requests in progress"),
])
def test_strategies_that_keep_entries_or_places_refuse_a_metered_unit_with_the_reason(strategy, reason):
    with pytest.raises(ValidationError) as refused:
        row(strategy=strategy, limit=100, unit="tokens").full_clean()
    [message] = refused.value.message_dict["unit"]
    assert f"{strategy} cannot count tokens: {reason}" in message
    assert "Choose fixed_window or sliding_window" in message or "Choose sliding_window or fixed_window" in message
    row(strategy=strategy, limit=100, unit="requests").full_clean()  # their own unit stays theirs


def test_the_registry_lists_the_strategies_that_count_units():
    assert set(strategies.counting_units()) == {"fixed_window", "sliding_window", "token_bucket", "calendar_quota"}
    assert all(strategies.get(name).unit_refusal for name in ("sliding_log", "concurrency"))


def test_the_registry_refuses_a_strategy_that_counts_units_without_saying_how_or_refuses_them_without_why():
    class Counting(strategies.Strategy):
        name, label, help, letter, order, reference = "counting", "Counting", "-", "y", 98, "tests/x.py::Model"
        counts_units = True

        def script(self) -> str:
            return "strategies.counting = {look = look, charge = charge, refund = refund}"

    class Silent(Counting):
        name, letter, counts_units, unit_refusal = "silent", "z", False, ""

        def script(self) -> str:
            return "strategies.silent = {look = look, charge = charge, refund = refund}"

    with pytest.raises(ImproperlyConfigured, match="'counting' counts metered units but says not how a settle"):
        strategies.registry([Counting()])
    with pytest.raises(ImproperlyConfigured, match="'silent' counts no metered unit but does not say why"):
        strategies.registry([Silent()])


def test_the_decorator_declares_a_unit_and_refuses_one_its_strategy_cannot_count():
    @ratelimit(rate="20000/m", key="ip", strategy="fixed_window", unit="tokens")
    def view(request):
        return None

    [name] = view._ratelimit_declared
    assert registry.declared(name).values["unit"] == "tokens"
    with pytest.raises(ImproperlyConfigured, match="sliding_log cannot count tokens: it keeps one entry per unit"):
        @ratelimit(rate="100/m", key="ip", strategy="sliding_log", unit="tokens")
        def other(request):
            return None
    with pytest.raises(TypeError, match="unit=.*with a rate"):
        ratelimit("search", unit="tokens")


@override_settings(RATELIMIT_POLICIES=[
    {"name": "llm", "action": "/llm/", "rate": "20000/m", "strategy": "fixed_window", "unit": "tokens"},
    {"name": "places", "action": "/llm/", "rate": "5/m", "strategy": "concurrency", "unit": "tokens"},
])
def test_the_system_check_reports_a_declared_unit_its_strategy_cannot_count():
    [error] = [m for m in run_checks() if m.id == "ratelimit_app.E010"]
    assert "RATELIMIT_POLICIES[1] (places)" in error.msg and "concurrency cannot count tokens" in error.msg
    assert [p.values["unit"] for p in settings_policies()] == ["tokens"]


def test_the_import_reads_the_unit_and_refuses_one_its_strategy_cannot_count():
    entry = {"name": "llm", "action": "/llm/", "rate": "20000/m", "strategy": "token_bucket", "unit": "tokens"}
    portable.import_data({"format": "ratelimit_app/1", "policies": [entry]})
    assert Policy.objects.get(name="llm").unit == "tokens"
    refused = {**entry, "name": "log", "strategy": "sliding_log", "rate": "100/m"}
    with pytest.raises(ImportRefused, match="sliding_log cannot count tokens: it keeps one entry per unit"):
        portable.import_data({"format": "ratelimit_app/1", "policies": [refused]})
    assert not Policy.objects.filter(name="log").exists()


def test_an_export_carries_the_unit():
    row(strategy="fixed_window", unit="content-bytes").save()
    [entry] = portable.export_data()["policies"]
    assert entry["unit"] == "content-bytes"


def test_a_code_row_written_before_units_existed_is_not_taken_for_an_operators_change():
    declared = registry.code_policy("old", action="/old/", origin="test", rate="5/m")
    values = {field: value for field, value in declared.values.items() if field != "unit"}
    Policy.objects.create(name="old", source="code", code_values=values, **declared.values)
    assert registry.changed_fields(Policy.objects.get(name="old")) == []


def test_the_overage_cap_goes_with_a_metered_unit_through_export_and_import_and_is_refused_on_requests():
    row(strategy="fixed_window", unit="tokens", overage_cap=500).save()
    [entry] = portable.export_data()["policies"]
    assert (entry["unit"], entry["overage_cap"]) == ("tokens", 500)
    Policy.objects.all().delete()
    portable.import_data({"format": "ratelimit_app/1", "policies": [entry]})
    assert compile_policy(Policy.objects.get(name="llm")).overage_cap == 500
    with pytest.raises(ValidationError) as refused:
        row(strategy="fixed_window", overage_cap=500).full_clean()
    assert "overage_cap" in refused.value.message_dict
