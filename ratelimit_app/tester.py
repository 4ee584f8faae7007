"""The admin's policy tester: which policies and overrides a described request meets, the subject
each computes, and what each would decide now, counting nothing."""

from __future__ import annotations

from typing import NamedTuple

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from . import engine
from .doors import route_of
from .limiter import Planned, plan
from .policies import get_index
from .subjects import meta_key
from .values import Check, CompiledPolicy, Decision

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class Explanation(NamedTuple):
    policy: CompiledPolicy
    planned: Planned | None  # None: the policy matches but its subject cannot be computed
    decision: Decision | None  # None: not asked (no subject, exempt, or Redis unreachable)


class Results(NamedTuple):
    names: tuple[str | None, ...]
    explanations: list[Explanation]
    error: str | None


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
        data = self.cleaned_data
        request = RequestFactory().generic(data["method"], data["path"], REMOTE_ADDR=data["ip"], **data["headers"])
        request.user = data["username"] or AnonymousUser()
        return request

    def explain(self) -> Results:
        request = self.request()
        names = route_of(request).names  # the URL name, a DRF scope, and the actions of @ratelimit on the view
        matching = get_index().matching(path=request.path_info, names=names, method=request.method)
        planned = {p.policy.id: p for p in plan(request, names)}
        asked = [p for p in planned.values() if p.limit is not None]
        decisions: dict[int, Decision] = {}
        error = None
        try:
            verdict = engine.decide([Check(p.policy, p.subject, p.limit) for p in asked], dry_run=True)
            decisions = {d.policy.id: d for d in verdict.decisions}
        except engine.RedisUnavailable as unavailable:
            error = f"Redis is unreachable, decisions cannot be shown: {unavailable}"
        explanations = [Explanation(p, planned.get(p.id), decisions.get(p.id)) for p in matching]
        return Results(names, explanations, error)
