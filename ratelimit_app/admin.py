"""The operator's side: policies and overrides in the admin, the live page, reset, and the tester."""

from __future__ import annotations

import re

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from . import live, tester
from .connection import RedisUnavailable
from .models import Mode, Override, Policy
from .policies import compile_policy

LIVE_ROWS = 100
UNKNOWN = "?"  # shown in the list when Redis cannot tell
INVALID = "invalid"  # shown in the list for a row that fails validation (it is not enforced)
SUBJECT_KEY = re.compile(r"[0-9a-f]{16}")  # what subjects.Subject.key holds


def human_window(seconds: int) -> str:
    """60 -> '1 min', 3600 -> '1 h', 90 -> '90 s'."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


class OverrideInline(admin.TabularInline):
    model = Override
    extra = 0
    fields = ("kind", "user", "group", "network", "header", "value", "exempt", "limit", "expires_at", "reason")
    autocomplete_fields = ("user", "group")


class PolicyListForm(forms.ModelForm):
    """The list's editable row: the mode shown by its short name, so the columns fit beside it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "mode" in self.fields:
            self.fields["mode"].choices = [(mode, mode) for mode in Mode.values]


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "action", "rate", "strategy", "key", "mode", "enabled", "active_now", "denied_now", "live_link")
    list_editable = ("mode", "enabled")
    list_filter = ("strategy", "mode", "enabled")
    search_fields = ("name", "action", "key", "description")
    actions = ("enable", "disable", "make_shadow", "make_enforce", "reset_counts")
    inlines = (OverrideInline,)
    readonly_fields = ("generation", "created", "updated")
    fieldsets = (
        (None, {"fields": ("name", "description", "enabled", "mode")}),
        ("What it protects", {"fields": ("action", "methods")}),
        ("How much", {"fields": ("limit", "window", "strategy", "bucket_size", "key")}),
        ("Bookkeeping", {"classes": ("collapse",), "fields": ("generation", "created", "updated")}),
    )

    # --- list -----------------------------------------------------------------------------------

    @admin.display(description="limit", ordering="limit")
    def rate(self, policy: Policy) -> str:
        return f"{policy.limit} / {human_window(policy.window)}"

    @admin.display(description="active now")
    def active_now(self, policy: Policy):
        activity = getattr(policy, "activity", UNKNOWN)
        return activity if isinstance(activity, str) else activity.active

    @admin.display(description="denied now")
    def denied_now(self, policy: Policy):
        """Denied in the current window; for a shadow policy, what it would have denied."""
        activity = getattr(policy, "activity", UNKNOWN)
        if isinstance(activity, str):
            return activity
        return f"{activity.denied} (would)" if policy.mode == Mode.SHADOW and activity.denied else activity.denied

    @admin.display(description="live")
    def live_link(self, policy: Policy) -> str:
        return format_html('<a href="{}">live</a>', reverse("admin:ratelimit_app_policy_live", args=[policy.pk]))

    def get_changelist_form(self, request, **kwargs):
        return super().get_changelist_form(request, form=PolicyListForm, **kwargs)

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        try:
            activity = live.policy_activity(list(changelist.result_list))
        except RedisUnavailable:
            activity = {}
            messages.warning(request, "Redis is unreachable: current activity is not shown.")
        for policy in changelist.result_list:
            found = activity.get(policy.pk, UNKNOWN)
            policy.activity = INVALID if found is None else found
        return changelist

    # --- bulk actions, each through save() so every worker hears of it ----------------------

    def _update(self, request, queryset, message: str, **changes) -> None:
        # counted while saving: the queryset may be filtered by the very field being changed
        changed = 0
        for policy in queryset:
            for field, value in changes.items():
                setattr(policy, field, value)
            policy.save()
            self.log_change(request, policy, [{"changed": {"fields": [Policy._meta.get_field(f).verbose_name for f in changes]}}])
            changed += 1
        self.message_user(request, message % {"count": changed}, messages.SUCCESS)

    @admin.action(description="Enable selected policies", permissions=("change",))
    def enable(self, request, queryset):
        self._update(request, queryset, "Enabled %(count)d policies.", enabled=True)

    @admin.action(description="Disable selected policies", permissions=("change",))
    def disable(self, request, queryset):
        self._update(request, queryset, "Disabled %(count)d policies.", enabled=False)

    @admin.action(description="Switch selected policies to shadow mode", permissions=("change",))
    def make_shadow(self, request, queryset):
        self._update(request, queryset, "%(count)d policies now only count and report.", mode=Mode.SHADOW)

    @admin.action(description="Switch selected policies to enforce mode", permissions=("change",))
    def make_enforce(self, request, queryset):
        self._update(request, queryset, "%(count)d policies now deny over their limit.", mode=Mode.ENFORCE)

    @admin.action(description="Reset the counts of selected policies", permissions=("change",))
    def reset_counts(self, request, queryset):
        reset = 0
        for policy in queryset:
            reset_all(policy)
            self.log_change(request, policy, "Reset the counts of every subject.")
            reset += 1
        self.message_user(request, f"Counts reset for {reset} policies.", messages.SUCCESS)

    # --- the live page, reset, tester, history --------------------------------------------------

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/live/", wrap(self.live_view), name="ratelimit_app_policy_live"),
            path("<int:pk>/live/reset/", wrap(self.reset_view), name="ratelimit_app_policy_reset"),
            path("tester/", wrap(self.tester_view), name="ratelimit_app_policy_tester"),
            path("changes/", wrap(self.changes_view), name="ratelimit_app_policy_changes"),
        ] + super().get_urls()

    def _policy_for(self, request, pk: int, *, change: bool = False) -> Policy:
        policy = get_object_or_404(Policy, pk=pk)
        allowed = self.has_change_permission(request, policy) if change else self.has_view_permission(request, policy)
        if not allowed:
            raise PermissionDenied
        return policy

    def live_view(self, request, pk: int):
        policy = self._policy_for(request, pk)
        data, status = live_data(policy, rows=_rows(request))
        if request.GET.get("format") == "json":
            return JsonResponse(data, status=status)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "original": policy,
            "title": f"Live usage: {policy.name}",
            "data": data,
            "rate": self.rate(policy),
            "window": human_window(policy.window),
            "can_reset": self.has_change_permission(request, policy),
            "exempt": [o for o in policy.overrides.filter(exempt=True).select_related("user", "group")],
        }
        return TemplateResponse(request, "admin/ratelimit_app/policy/live.html", context, status=status)

    def reset_view(self, request, pk: int):
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:ratelimit_app_policy_live", args=[pk]))
        policy = self._policy_for(request, pk, change=True)
        subject = request.POST.get("subject", "").strip()
        try:
            if subject:
                if not SUBJECT_KEY.fullmatch(subject):
                    raise ValidationError(f"{subject[:40]!r} is not a subject key (16 hex digits, as the live page sends).")
                shown = live.reset_subjects(compile_policy(policy), [subject])
                message = f"Counts of subject {' / '.join(shown) or subject} reset for {policy.name}."
            else:
                reset_all(policy)
                message = f"Counts of every subject reset for {policy.name}."
        except RedisUnavailable as error:
            self.message_user(request, f"Nothing was reset: Redis is unreachable ({error}).", messages.ERROR)
        except ValidationError as error:
            self.message_user(request, f"Nothing was reset: {' '.join(error.messages)}", messages.ERROR)
        else:
            self.log_change(request, policy, message)
            self.message_user(request, message, messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:ratelimit_app_policy_live", args=[pk]))

    def tester_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = tester.TesterForm(request.POST or None)
        results = form.explain() if request.method == "POST" and form.is_valid() else None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Policy tester",
            "crumb": "Tester",
            "form": form,
            "results": results,
        }
        return TemplateResponse(request, "admin/ratelimit_app/policy/tester.html", context)

    def changes_view(self, request):
        """Who changed which policy or override, and when (the admin's own log of changes)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        types = ContentType.objects.get_for_models(Policy, Override).values()
        entries = LogEntry.objects.filter(content_type__in=types).select_related("user", "content_type")[:200]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Changes to policies and overrides",
            "crumb": "Changes",
            "entries": entries,
        }
        return TemplateResponse(request, "admin/ratelimit_app/policy/changes.html", context)


@admin.register(Override)
class OverrideAdmin(admin.ModelAdmin):
    list_display = ("policy", "matcher", "effect", "expires_at", "reason", "updated")
    list_filter = ("policy", "kind", "exempt")
    search_fields = ("policy__name", "network", "header", "reason", "user__username", "group__name")
    autocomplete_fields = ("user", "group")
    list_select_related = ("policy", "user", "group")

    @admin.display(description="matches")
    def matcher(self, override: Override) -> str:
        return override.matcher_display()

    @admin.display(description="effect")
    def effect(self, override: Override) -> str:
        return "exempt" if override.exempt else f"limit {override.limit}"


def reset_all(policy: Policy) -> None:
    """Start every subject of the policy afresh: counters carry the generation, old ones just expire."""
    policy.generation += 1
    policy.save(update_fields=["generation", "updated"])


def _rows(request) -> int:
    try:
        return max(1, min(int(request.GET.get("limit", LIVE_ROWS)), 1000))
    except ValueError:
        return LIVE_ROWS


def live_data(policy: Policy, rows: int = LIVE_ROWS) -> tuple[dict, int]:
    """The live page's data in the JSON shape of DESIGN.md, and the HTTP status to answer with."""
    data: dict = {
        "policy": {
            "id": policy.pk, "name": policy.name, "action": policy.action, "limit": policy.limit,
            "window": policy.window, "strategy": policy.strategy, "key": policy.key, "mode": policy.mode,
        },
        "subjects": [],
        "totals": {"allowed": 0, "denied": 0},
        "active": 0,
        "shown": 0,
        "blocked": 0,
    }
    try:
        usage = live.live_usage(compile_policy(policy), rows=rows)
    except ValidationError as error:
        return {**data, "error": f"This policy is invalid and not enforced: {'; '.join(error.messages)}"}, 200
    except RedisUnavailable as error:
        return {**data, "error": f"Redis is unreachable, live usage cannot be shown: {error}"}, 503
    data["subjects"] = [
        {
            "subject": s.display, "key": s.key, "count": s.count, "limit": s.limit,
            "remaining": max(s.limit - s.count, 0), "reset_in": round(s.reset_in, 1),
            "blocked": s.count >= s.limit, "overridden": s.overridden,
        }
        for s in usage.subjects
    ]
    data["totals"] = {"allowed": usage.allowed, "denied": usage.denied}
    # the listed subjects are all the active ones unless the index was full: then the totals say how many
    data["shown"] = usage.shown
    data["active"] = usage.active if usage.index_full else usage.shown
    data["blocked"] = usage.blocked
    return data, 200
