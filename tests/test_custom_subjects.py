"""A policy key may name a function of the project by dotted path: it says who the request is counted as."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.test import RequestFactory

import ratelimit_app
from ratelimit_app.models import Policy
from ratelimit_app.subjects import parse_key_spec, subject_for
from ratelimit_app.testing import temporary_policy

pytestmark = pytest.mark.django_db
NOT_A_FUNCTION = "acme"


def tenant(request) -> str | None:
    """The kind of function a project writes: its tenant from a header, None when there is none."""
    return request.META.get("HTTP_X_TENANT")


def request(tenant_name: str | None = None, ip: str = "203.0.113.7"):
    made = RequestFactory().get("/export/", REMOTE_ADDR=ip, **({"HTTP_X_TENANT": tenant_name} if tenant_name else {}))
    made.user = AnonymousUser()
    return made


def test_requests_are_counted_per_value_the_function_returns():
    with temporary_policy(action="export", limit=1, window=60, key="tests.test_custom_subjects.tenant"):
        assert ratelimit_app.hit(request("acme", ip="203.0.113.7"), "export").allowed
        # another address of the same tenant shares its quota; another tenant has its own
        assert not ratelimit_app.hit(request("acme", ip="198.51.100.9"), "export").allowed
        assert ratelimit_app.hit(request("globex"), "export").allowed


def test_the_policy_does_not_apply_when_the_function_returns_none():
    with temporary_policy(action="export", limit=1, window=60, key="tests.test_custom_subjects.tenant"):
        for _ in range(3):
            verdict = ratelimit_app.hit(request(None), "export")
            assert verdict.allowed and not verdict.decisions


def test_a_function_combines_with_other_parts():
    spec = parse_key_spec("ip, tests.test_custom_subjects.tenant")
    one, other = subject_for(spec, request("acme")), subject_for(spec, request("acme", ip="198.51.100.9"))
    assert one.display == "ip:203.0.113.7, tests.test_custom_subjects.tenant=acme"
    assert one.key != other.key
    assert subject_for(spec, request(None)) is None


@pytest.mark.parametrize(
    "path, message",
    [
        ("tests.test_custom_subjects.missing", "Cannot import the key function 'tests.test_custom_subjects.missing'"),
        ("no_such_module.keys.tenant", "Cannot import the key function 'no_such_module.keys.tenant'"),
        ("tests.test_custom_subjects.NOT_A_FUNCTION", "is not a function"),
    ],
)
def test_a_key_function_that_cannot_be_used_is_refused_when_the_policy_is_saved(path, message):
    policy = Policy(name="per-tenant", action="export", limit=1, window=60, key=path)
    with pytest.raises(ValidationError) as refused:
        policy.full_clean()
    assert message in " ".join(refused.value.message_dict["key"])
    assert not Policy.objects.exists()
