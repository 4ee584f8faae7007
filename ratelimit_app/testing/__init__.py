"""Helpers for your own tests: forget what the app keeps in a process, forget counters, install a
policy, a plan or an override for the length of a block, and tell what a response was charged.

`pip install "ratelimit-app[testing]"` also gives a pytest plugin and `RatelimitTestRunner` for
`manage.py test`, which start a Redis-compatible server for the tests and call these between tests."""

from __future__ import annotations

import contextlib
from typing import Iterator

from .. import policies, registry, runtime
from ..engine import bump_version, key_prefix
from ..engine import client as redis_client
from ..deny_cache import deny_cache
from ..doors import STATE_ATTRIBUTE
from ..models import Override, Plan, PlanAssignment, PlanLimit, Policy
from ..subjects.reading import http_request

__all__ = [
    "reset", "reset_counters", "temporary_policy", "temporary_override", "temporary_plan", "charged", "assert_charged",
    "RatelimitTestRunnerMixin", "RatelimitTestRunner",
]


def reset() -> None:
    """Forget everything ratelimit_app keeps in this process, as if it had just started: the policy
    index (loaded again at the next request), the policies views declared (declared again for the
    views of the URLconf in use, and their rows written again), refusals kept in memory, the circuit
    breaker and what the logs already said, in-flight places and counts not yet sent to Redis, quota
    usage not saved yet, the Redis clients and kept connections, and whatever was read from the
    settings. Redis and the database are left as they are (see reset_counters()).

    Call it between tests that roll the database back or empty Redis, e.g. in an autouse fixture.
    """
    runtime.state.reset()


def reset_counters() -> int:
    """Delete every key under RATELIMIT_KEY_PREFIX (SCAN is fine here: this is for tests); returns how many."""
    client = redis_client()
    names = list(client.scan_iter(match=f"{key_prefix()}:*", count=1000))
    if names:
        client.delete(*names)
    deny_cache.clear()  # the refusals of those counters
    # the policy version went with them: announced again now (no row changed, so no commit to wait for,
    # and a test without database access can call this)
    policies.forget_index()
    bump_version()
    return len(names)


@contextlib.contextmanager
def temporary_policy(**fields) -> Iterator[Policy]:
    """A validated, saved policy that exists only inside the block (needs database access)."""
    fields.setdefault("name", "temporary-policy")
    policy = Policy(**fields)
    policy.full_clean()
    policy.save()
    try:
        yield policy
    finally:
        policy.delete()


def _matching(user=None, ip: str = "", header: str = "", value: str = "", group=None) -> dict:
    """The fields of an override or a plan assignment matching exactly one of: a user, an IP address or
    network, a header value, a group's members."""
    given = {"user": user is not None, "ip": bool(ip), "header": bool(header or value), "group": group is not None}
    kinds = [kind for kind, chosen in given.items() if chosen]
    if len(kinds) != 1:
        raise TypeError("Match exactly one of user=, ip=, header= with value=, group=.")
    return {"kind": kinds[0], "user": user, "network": ip, "header": header, "value": value, "group": group}


def _policy(policy: Policy | str) -> Policy:
    """The policy named, its row written first if views declare it and no request wrote it yet."""
    if isinstance(policy, Policy):
        return policy
    registry.sync_pending()
    try:
        return Policy.objects.get(name=policy)
    except Policy.DoesNotExist:
        known = sorted(Policy.objects.values_list("name", flat=True))
        raise LookupError(f"No policy named {policy!r}; the policies are {known}") from None


@contextlib.contextmanager
def temporary_override(
    policy: Policy | str, *, limit: int | None = None, exempt: bool = False, user=None, ip: str = "",
    header: str = "", value: str = "", group=None,
) -> Iterator[Override]:
    """A validated, saved override of `policy` (a Policy or its name) for one user, address or network,
    header value or group, that exists only inside the block: `limit=` another limit, or `exempt=True`."""
    override = Override(policy=_policy(policy), limit=limit, exempt=exempt,
                        **_matching(user, ip, header, value, group))
    override.full_clean()
    override.save()
    try:
        yield override
    finally:
        override.delete()


@contextlib.contextmanager
def temporary_plan(
    limits: dict[str, int | None], *, name: str = "temporary-plan", user=None, ip: str = "", header: str = "",
    value: str = "", group=None,
) -> Iterator[Plan]:
    """A saved plan that exists only inside the block: `limits` maps policy names to the plan's limit
    (None: exempt), and the plan is assigned to one user, address or network, header value or group."""
    plan = Plan(name=name)
    plan.full_clean()
    plan.save()
    try:
        for policy_name, limit in limits.items():
            row = PlanLimit(plan=plan, policy=_policy(policy_name), limit=limit, exempt=limit is None)
            row.full_clean()
            row.save()
        assignment = PlanAssignment(plan=plan, **_matching(user, ip, header, value, group))
        assignment.full_clean()
        assignment.save()
        yield plan
    finally:
        plan.delete()  # its limits and assignments go with it


def charged(response, request=None) -> dict[str, int]:
    """The units each policy took from the request that `response` answers, by policy name: the
    request's cost under every policy that decided it, or 0 under each when it was refused (a refused
    request is counted nowhere). Django's test clients keep the request on the response; pass
    `request` for a response made otherwise (a view called with a RequestFactory request)."""
    request = request if request is not None else _request_of(response)
    state = http_request(request).__dict__.get(STATE_ATTRIBUTE)
    if state is None:
        return {}
    refused = bool(state.denied) or state.refused
    return {decision.policy.name: 0 if refused else decision.cost for decision in state.decisions}


def _request_of(response):
    for name in ("wsgi_request", "asgi_request"):
        request = getattr(response, name, None)
        if request is not None:
            return request
    raise TypeError("This response does not carry its request (Django's test clients set it): pass request=.")


def assert_charged(response, policy: str, units: int = 1, request=None) -> None:
    """Fail unless the request `response` answers took `units` from the policy named `policy` (0: it
    was decided under that policy but refused, so not counted); the message shows what it was charged
    and the response's RateLimit headers. A shadow policy, which sends no headers, is checked too."""
    taken = charged(response, request)
    if taken.get(policy) != units:
        headers = {name: response.headers[name] for name in ("RateLimit-Policy", "RateLimit", "Retry-After")
                   if name in response.headers}
        said = f"not decided under {policy!r}" if policy not in taken else f"charged {taken[policy]}"
        raise AssertionError(
            f"Expected {units} unit(s) of policy {policy!r}, {said}; charged by policy: {taken}; headers: {headers}"
        )


def __getattr__(name: str):
    # the runner imports django.test's runner, which a test module importing these helpers rarely needs
    if name in ("RatelimitTestRunnerMixin", "RatelimitTestRunner"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'ratelimit_app.testing' has no attribute {name!r}")
