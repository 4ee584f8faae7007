"""The admin's policy tester: which policies, overrides and plan a described request meets, the
subject each computes, what the request costs and where that comes from, and what each policy would
decide now, counting nothing."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.urls import Resolver404, resolve

from . import engine
from .doors import route_of
from .actions import Planned, checks_for, plan
from .plans import CompiledAssignment, assignment_of
from .policies import PolicyIndex, get_index
from .rates import amount, figure, human_limit, human_per
from .subjects import meta_key
from .values import REQUESTS, CompiledPolicy, Decision

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
PER_REQUEST = "per request"  # the view's code computes its cost from each request


class Cost(NamedTuple):
    """What a request costs, in units of every policy that applies, and where that comes from."""

    units: int | None  # None: computed per request by the view's code (the tester counts 1)
    action: str | None  # the admin action cost that sets it; it wins over the code's
    code: int | str | None  # the view's code's cost: a number, PER_REQUEST, or None (none set)

    @property
    def text(self) -> str:
        if self.action is not None:
            overrides = ""
            if self.code == PER_REQUEST:
                overrides = "; overrides the code's cost computed per request"
            elif self.code is not None:
                overrides = f"; overrides the code's {self.code}"
            return f"Cost: {_units(self.units)} (admin action cost {self.action!r}{overrides})"
        if self.code == PER_REQUEST:
            return "Cost: computed per request by the view's code"
        if self.code is not None:
            return f"Cost: {_units(self.code)} (from the view's code)"
        return "Cost: 1 unit"

    @property
    def counted(self) -> int:
        """The units the dry run asks for (1 for a cost the code computes per request)."""
        return self.units or 1


def _units(number: int | None) -> str:
    return "1 unit" if number == 1 else f"{number} units"


def code_cost(path: str, urlconf: str | None = None) -> int | str | None:
    """The cost the view at `path` declares in code: @ratelimit(cost=...) sets `ratelimit_cost` on the
    view (a number, or a callable of the request); a DRF view class has `throttle_cost` or
    `get_throttle_cost()`. PER_REQUEST for a callable; None for a view that sets none."""
    try:
        match = resolve(path, urlconf)
    except Resolver404:
        return None
    view_class = getattr(match.func, "cls", None)
    declared: Any = getattr(match.func, "ratelimit_cost", None)
    if declared is None and view_class is not None:
        declared = getattr(view_class, "throttle_cost", None)
        if declared is None and callable(getattr(view_class, "get_throttle_cost", None)):
            return PER_REQUEST
    if callable(declared):
        return PER_REQUEST
    return declared if isinstance(declared, int) and not isinstance(declared, bool) else None


def request_cost(index: PolicyIndex, request, names: tuple[str | None, ...]) -> Cost:
    """The request's cost: the largest admin action cost it meets (admin data wins over code), else
    the code's, else 1."""
    code = code_cost(request.path_info, getattr(request, "urlconf", None))
    priced = index.priced_by(path=request.path_info, names=names)
    if priced:
        action, units = max(priced, key=lambda pair: pair[1])
        return Cost(units, action, code)
    if code == PER_REQUEST:
        return Cost(None, None, code)
    return Cost(1 if code is None else code, None, code)


class Explanation(NamedTuple):
    policy: CompiledPolicy
    planned: Planned | None  # None: the policy matches but its subject cannot be computed
    decision: Decision | None  # None: not asked (no subject, exempt, or Redis unreachable)

    @property
    def limit_from(self) -> str:
        """Where the limit in effect comes from: 'override', 'plan <name>' or 'policy'."""
        if self.planned is None:
            return "-"
        if self.planned.override is not None:
            return "override"
        return f"plan {self.planned.plan.name}" if self.planned.by_plan else "policy"

    @property
    def limit_text(self) -> str:
        """The limit in effect in the policy's unit, '20,000 tokens / 1 min'; 'exempt'; '-' when it does not apply."""
        if self.planned is None:
            return "-"
        if self.planned.limit is None:
            return "exempt"
        policy = self.policy
        return human_limit(self.planned.limit, policy.unit, human_per(policy.window, policy.period, policy.time_zone))

    @property
    def count_text(self) -> str:
        return "-" if self.decision is None else figure(self.decision.count, self.policy.unit)

    @property
    def would(self) -> str:
        """What the policy would do with the request: 'allow, 9,000 tokens left', 'deny, retry in 41 s'."""
        if self.planned is None:
            return f"does not apply: no subject ({self.policy.key} cannot be computed)"
        if self.planned.limit is None:
            return "allow (exempt)"
        decision = self.decision
        if decision is None:
            return "unknown (Redis unreachable)"
        if not decision.exceeded:
            return f"allow, {amount(decision.remaining, self.policy.unit)} left"
        if decision.allowed:
            return "allow, but over the limit (shadow)"
        if decision.retry_after is None:
            return "deny: the cost is more than it ever allows at once"
        return f"deny, retry in {math.ceil(decision.retry_after)} s"


class Results(NamedTuple):
    names: tuple[str | None, ...]
    explanations: list[Explanation]
    error: str | None
    cost: Cost
    assignment: CompiledAssignment | None = None  # what puts the request on a plan (None: on none)

    @property
    def metered(self) -> str:
        """What the matching policies in a metered unit do with the cost ('' when none is metered)."""
        units = sorted({e.policy.unit for e in self.explanations if e.policy.unit != REQUESTS})
        if not units:
            return ""
        named = " and ".join(units)
        said = (f"The cost is the estimate the policies in {named} admit the request on; they are then charged "
                "what it used (the view's ratelimit_app.settle(), or the bytes the response sent).")
        if any(e.policy.unit == REQUESTS for e in self.explanations):
            said += " The policies counting requests count it as one request."
        return said


class TesterForm(forms.Form):
    method = forms.ChoiceField(choices=[(m, m) for m in METHODS], initial="GET")
    path = forms.CharField(initial="/", help_text="The path of the request, e.g. /api/items/ or /demo/search/.")
    username = forms.CharField(required=False, help_text="Blank for an anonymous request.")
    ip = forms.GenericIPAddressField(label="Client IP", initial="203.0.113.7", help_text="REMOTE_ADDR of the request.")
    headers = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="One 'Name: value' per line, e.g. 'X-Api-Key: abc123' or 'X-Forwarded-For: 198.51.100.1'.",
    )

    def clean_path(self) -> str:
        value = self.cleaned_data["path"].strip()
        if not value.startswith("/"):
            raise forms.ValidationError("A path starts with '/', e.g. /api/items/.")
        return value

    def clean_username(self):
        name = self.cleaned_data["username"].strip()
        if not name:
            return None
        user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: name}).first()
        if user is None:
            raise forms.ValidationError(f"No user named {name!r}.")
        return user

    def clean_headers(self) -> dict[str, str]:
        meta = {}
        for number, line in enumerate(self.cleaned_data["headers"].splitlines(), start=1):
            if not line.strip():
                continue
            name, colon, value = line.partition(":")
            if not colon or not name.strip():
                raise forms.ValidationError(f"Line {number} is not 'Name: value'.")
            meta[meta_key(name)] = value.strip()
        return meta

    def request(self):
        # imported here: django.test brings unittest, jinja2 and more into every worker that loads the admin
        from django.test import RequestFactory

        data = self.cleaned_data
        request = RequestFactory().generic(data["method"], data["path"], REMOTE_ADDR=data["ip"], **data["headers"])
        request.user = data["username"] or AnonymousUser()
        return request

    def explain(self) -> Results:
        request = self.request()
        names = route_of(request).names  # the URL name, a DRF scope, and the actions of @ratelimit on the view
        index = get_index()
        matching = index.matching(path=request.path_info, names=names, method=request.method)
        cost = request_cost(index, request, names)
        planned = {p.policy.id: p for p in plan(request, names, index=index)}
        decisions: dict[int, Decision] = {}
        error = None
        try:
            verdict = engine.decide(checks_for(planned.values()), dry_run=True, cost=cost.counted)
            decisions = {d.policy.id: d for d in verdict.decisions}
        except engine.RedisUnavailable as unavailable:
            error = f"Redis is unreachable, decisions cannot be shown: {unavailable}"
        explanations = [Explanation(p, planned.get(p.id), decisions.get(p.id)) for p in matching]
        return Results(names, explanations, error, cost, assignment_of(index.plans, request))
