"""The policy admin's extra pages, each a view of its own: what they share (the admin's permissions and
page context), reverting a code policy, the tester, and the log of changes."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views import View

from .. import registry, tester
from ..models import ActionCost, Override, Plan, Policy


class PolicyPage(View):
    """A page beside the policy admin: it asks the admin for permissions and renders in the admin site."""

    model_admin: admin.ModelAdmin | None = None  # given by PolicyAdmin.get_urls: as_view(model_admin=self)

    def policy(self, pk: int, *, change: bool = False) -> Policy:
        """The policy of the URL (404 first), if the user may view it (or change it)."""
        policy = get_object_or_404(Policy, pk=pk)
        may = self.model_admin.has_change_permission if change else self.model_admin.has_view_permission
        if not may(self.request, policy):
            raise PermissionDenied
        return policy

    def require_view(self) -> None:
        if not self.model_admin.has_view_permission(self.request):
            raise PermissionDenied

    def say(self, message: str, level: int) -> None:
        self.model_admin.message_user(self.request, message, level)

    def render(self, template: str, status: int = 200, **context) -> TemplateResponse:
        context = {**self.model_admin.admin_site.each_context(self.request), "opts": Policy._meta, **context}
        return TemplateResponse(self.request, f"admin/ratelimit_app/policy/{template}", context, status=status)


class RevertPage(PolicyPage):
    """The change form's button: put the code's values back into a policy declared in code."""

    def get(self, request, pk: int):
        self.policy(pk, change=True)
        return self.back_to(pk)

    def post(self, request, pk: int):
        policy = self.policy(pk, change=True)
        if policy.source == "code":
            changed = registry.revert(policy)
            if changed:
                self.model_admin.log_change(request, policy, f"Reverted to the code's values: {', '.join(changed)}.")
                self.say(f"{policy.name} reverted to the code's values ({', '.join(changed)}).", messages.SUCCESS)
            else:
                self.say(f"{policy.name} already has the code's values.", messages.INFO)
        return self.back_to(pk)

    def back_to(self, pk: int) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:ratelimit_app_policy_change", args=[pk]))


class TesterPage(PolicyPage):
    """Which policies, overrides and plan a described request meets, and what each would decide now."""

    def get(self, request):
        self.require_view()
        form = tester.TesterForm(request.POST or None)
        results = form.explain() if request.method == "POST" and form.is_valid() else None
        return self.render("tester.html", title="Policy tester", crumb="Tester", form=form, results=results)

    post = get


class ChangesPage(PolicyPage):
    """Who changed which policy, override, action cost or plan, and when (the admin's own log of changes)."""

    def get(self, request):
        self.require_view()
        types = ContentType.objects.get_for_models(Policy, Override, ActionCost, Plan).values()
        entries = LogEntry.objects.filter(content_type__in=types).select_related("user", "content_type")[:200]
        title = "Changes to policies, overrides, action costs and plans"
        return self.render("changes.html", title=title, crumb="Changes", entries=entries)
