"""The operator's side: policies, overrides, action costs and plans in the admin, the live page, reset,
and the tester."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from . import admin_usage  # noqa: F401 - registers the quota usage pages
from . import operations, registry, strategies, tester
from .engine import RedisUnavailable
from .models import ActionCost, Mode, Override, Plan, PlanAssignment, PlanLimit, Policy
from .periods import LABELS as PERIOD_LABELS
from .periods import PERIODS
from .rates import EXAMPLES, format_rate, human_window, parse_quota, parse_rate

UNKNOWN = "?"  # shown in the list when Redis cannot tell
INVALID = "invalid"  # shown in the list for a row that fails validation (it is not enforced)


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


class PolicyForm(forms.ModelForm):
    """The change form, with a `rate` field: '100/m' fills the limit and the window in one go."""

    rate = forms.CharField(
        label="rate",
        required=False,
        help_text=(
            f"Optional shorthand for the limit and the window, {EXAMPLES}; or a calendar quota, e.g. 10000/month, "
            "500/week, 1000/calendar-day (1000/day is a window of 86,400 seconds). When given, it wins over both."
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for field in ("limit", "window"):  # the rate may stand in for them
            if field in self.fields and "rate" in self.fields:
                self.fields[field].required = False

    def clean(self) -> dict:
        data = super().clean()
        rate = (data.get("rate") or "").strip()
        quota = parse_quota(rate)
        if quota:  # the calendar quota strategy counts it
            data["limit"], data["period"] = quota
            data["window"], data["strategy"] = PERIODS[quota[1]], strategies.calendar()
            for field in ("limit", "window", "period", "strategy"):
                self.errors.pop(field, None)
        elif rate:
            try:
                data["limit"], data["window"] = parse_rate(rate)
            except ValueError as error:
                self.add_error("rate", str(error))
                return data
            self.errors.pop("limit", None)
            self.errors.pop("window", None)
            if data["limit"] < 1:
                self.add_error("rate", "The limit must be at least 1 request per window.")
        else:
            for field in ("limit", "window"):
                if field == "window" and data.get("strategy") == strategies.calendar():
                    continue  # the period sets it
                if field in self.fields and data.get(field) is None and field not in self.errors:
                    self.add_error(field, "Give a value here, or a rate such as 100/m.")
        return data


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    form = PolicyForm
    list_display = ("name", "origin", "action", "rate", "strategy", "key", "mode", "enabled", "active_now", "denied_now", "denials_trend", "live_link")
    list_editable = ("mode", "enabled")
    list_filter = ("strategy", "mode", "enabled")
    search_fields = ("name", "action", "key", "description")
    actions = ("enable", "disable", "make_shadow", "make_enforce", "reset_counts", "revert_to_code")
    inlines = (OverrideInline,)
    readonly_fields = ("generation", "created", "updated")
    fieldsets = (
        (None, {"fields": ("name", "description", "enabled", "mode")}),
        ("What it protects", {"fields": ("action", "methods")}),
        ("How much", {"fields": ("rate", "limit", "window", "strategy", "bucket_size", "burst", "period", "time_zone", "key")}),
        ("Bookkeeping", {"classes": ("collapse",), "fields": ("generation", "created", "updated")}),
    )

    # --- list -----------------------------------------------------------------------------------

    @admin.display(description="limit", ordering="limit")
    def rate(self, policy: Policy) -> str:
        if policy.period:
            return f"{policy.limit} / {PERIOD_LABELS[policy.period]} ({policy.time_zone or settings.TIME_ZONE})"
        burst = f", burst {policy.burst}" if policy.burst else ""
        return f"{policy.limit} / {human_window(policy.window)}{burst}"

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
            activity = operations.policy_activity(list(changelist.result_list))
        except RedisUnavailable:
            activity = {}
            messages.warning(request, "Redis is unreachable: current activity is not shown.")
        for policy in changelist.result_list:
            found = activity.get(policy.pk, UNKNOWN)
            policy.activity = INVALID if found is None else found
        self._attach_trends(changelist.result_list)
        return changelist

    # --- the list's sparkline of denials ------------------------------------------------------

    def _attach_trends(self, policies) -> None:
        try:
            trends = operations.policy_trends(list(policies))
        except RedisUnavailable:
            trends = {}  # the activity columns already say that Redis is unreachable
        for policy in policies:
            policy.trend = trends.get(policy.pk)

    @admin.display(description="denied, trend")
    def denials_trend(self, policy: Policy):
        """Denials per window over the trend's span (for a shadow policy: what it would have denied)."""
        trend = getattr(policy, "trend", None)
        if not trend:
            return "?"
        return sparkline([point.denied for point in trend], f"{sum(p.denied for p in trend)} denied in the last {human_window(policy.window * len(trend))}")

    # --- bulk actions, each through save() so every worker hears of it ----------------------

    def _update(self, request, queryset, message: str, **changes) -> None:
        # counted while saving: the queryset may be filtered by the very field being changed
        changed = 0
        for policy in queryset:
            for field, value in changes.items():
                setattr(policy, field, value)
            try:
                policy.validate_constraints()  # enabling or enforcing it must not meet a cost it can never admit
            except ValidationError as error:
                self.message_user(request, f"{policy.name} was not changed: {' '.join(error.messages)}", messages.ERROR)
                continue
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
            operations.reset_all(policy)
            self.log_change(request, policy, "Reset the counts of every subject.")
            reset += 1
        self.message_user(request, f"Counts reset for {reset} policies.", messages.SUCCESS)

    # --- policies declared in code: marked, code-owned fields read-only, revert ----------------------

    @admin.display(description="from")
    def origin(self, policy: Policy) -> str:
        """'admin', 'code', 'code, changed here' or 'code, no longer in code'."""
        if policy.source != "code":
            return "admin"
        if registry.no_longer_in_code(policy, self._declared_names()):
            return "code, no longer in code"
        return "code, changed here" if registry.changed_fields(policy) else "code"

    def _declared_names(self) -> set[str]:
        names = getattr(self, "_names_this_request", None)
        return registry.declared_names() if names is None else names

    @admin.display(description="declared in code")
    def code_status(self, policy: Policy) -> str:
        values = policy.code_values or {}
        rate = format_rate(values.get("limit", 0), values.get("window", 1))
        said = f"The code declares {rate}, {values.get('strategy')}, per {values.get('key')}, {values.get('mode')}" + (
            "" if values.get("enabled", True) else ", disabled"
        )
        changed = registry.changed_fields(policy)
        if registry.no_longer_in_code(policy):
            return said + ". No code loaded here declares it any more: it is kept, and enforced, as it is."
        if not changed:
            return said + ". This policy has the code's values."
        shown = ", ".join(f"{field} {getattr(policy, field)} (code: {values.get(field)})" for field in changed)
        return said + f". Changed here: {shown}. A deploy does not override these until you revert."

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        if obj is not None and obj.source == "code":
            return (*fields, "code_status", "name", "action", "key", "methods")  # the code decides these
        return fields

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None and obj.source == "code":
            fieldsets = (("Declared in code", {"fields": ("code_status",)}), *fieldsets)
        return fieldsets

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and obj.source == "code" and not registry.no_longer_in_code(obj):
            return False  # it would come back at the next load: disable it instead
        return super().has_delete_permission(request, obj)

    def changelist_view(self, request, extra_context=None):
        self._names_this_request = registry.declared_names()  # once per page, not once per row
        try:
            return super().changelist_view(request, extra_context)
        finally:
            self._names_this_request = None

    @admin.action(description="Revert selected policies to the code's values", permissions=("change",))
    def revert_to_code(self, request, queryset):
        reverted = 0
        for policy in queryset.filter(source="code"):
            changed = registry.revert(policy)
            if changed:
                self.log_change(request, policy, f"Reverted to the code's values: {', '.join(changed)}.")
                reverted += 1
        self.message_user(request, f"{reverted} policies reverted to the code's values.", messages.SUCCESS)

    def revert_view(self, request, pk: int):
        policy = self._policy_for(request, pk, change=True)
        if request.method == "POST" and policy.source == "code":
            changed = registry.revert(policy)
            if changed:
                self.log_change(request, policy, f"Reverted to the code's values: {', '.join(changed)}.")
                self.message_user(request, f"{policy.name} reverted to the code's values ({', '.join(changed)}).", messages.SUCCESS)
            else:
                self.message_user(request, f"{policy.name} already has the code's values.", messages.INFO)
        return HttpResponseRedirect(reverse("admin:ratelimit_app_policy_change", args=[pk]))

    # --- the live page, reset, tester, history --------------------------------------------------

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/revert/", wrap(self.revert_view), name="ratelimit_app_policy_revert"),
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
        data, status = operations.live_snapshot(policy, rows=_rows(request))
        data["trend"] = [] if "error" in data else operations.trend_data(policy)
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
            "plans": list(policy.plan_limits.select_related("plan").order_by("plan__name")),
            # an in-flight policy counts requests in progress, until their leases end
            "in_flight": policy.strategy in strategies.STRATEGIES and strategies.get(policy.strategy).holds,
        }
        return TemplateResponse(request, "admin/ratelimit_app/policy/live.html", context, status=status)

    def reset_view(self, request, pk: int):
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:ratelimit_app_policy_live", args=[pk]))
        policy = self._policy_for(request, pk, change=True)
        subject = request.POST.get("subject", "").strip()
        try:
            if subject:
                shown, _had_counts = operations.reset_subject(policy, subject)  # as the server knows it
                message = f"Counts of subject {shown} reset for {policy.name}."
            else:
                operations.reset_all(policy)
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
        """Who changed which policy, override or action cost, and when (the admin's own log of changes)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        types = ContentType.objects.get_for_models(Policy, Override, ActionCost, Plan).values()
        entries = LogEntry.objects.filter(content_type__in=types).select_related("user", "content_type")[:200]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Changes to policies, overrides, action costs and plans",
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


class PlanLimitInline(admin.TabularInline):
    model = PlanLimit
    extra = 1
    fields = ("policy", "limit", "exempt")
    autocomplete_fields = ("policy",)
    verbose_name_plural = "limits (a policy the plan does not name keeps its own limit)"


class PlanAssignmentInline(admin.TabularInline):
    model = PlanAssignment
    extra = 1
    fields = ("kind", "user", "group", "network", "header", "value", "expires_at", "reason")
    autocomplete_fields = ("user", "group")
    verbose_name_plural = "who is on the plan (users, groups, API keys, networks)"


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    """A plan with its limits and its assignments on one page: saving it reaches every worker within a second."""

    list_display = ("name", "limits_display", "assigned", "description", "updated")
    search_fields = ("name", "description", "limits__policy__name", "assignments__user__username", "assignments__group__name")
    inlines = (PlanLimitInline, PlanAssignmentInline)
    readonly_fields = ("created", "updated")

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("limits__policy", "assignments")

    @admin.display(description="limits")
    def limits_display(self, plan: Plan) -> str:
        return ", ".join(
            f"{row.policy.name}: {'exempt' if row.exempt else row.limit}" for row in plan.limits.all()
        ) or "none yet"

    @admin.display(description="assigned")
    def assigned(self, plan: Plan) -> int:
        return len(plan.assignments.all())


@admin.register(ActionCost)
class ActionCostAdmin(admin.ModelAdmin):
    list_display = ("action", "cost", "note")
    search_fields = ("action",)
    readonly_fields = ("updated",)


def _rows(request) -> int:
    try:
        return max(1, min(int(request.GET.get("limit", operations.LIVE_ROWS)), 1000))
    except ValueError:
        return operations.LIVE_ROWS


# --- trends: the live page's chart and the list's sparkline --------------------------------------


def sparkline(values: list[int], title: str) -> str:
    """A small inline SVG line of `values` (no external asset), scaled to its own maximum."""
    width, height = 60, 16
    top = max(values) or 1
    step = width / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{height - 1 - (height - 2) * value / top:.1f}" for i, value in enumerate(values))
    return format_html(
        '<svg class="rl-spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<title>{}</title><polyline points="{}" fill="none" stroke="{}" stroke-width="1.5"/></svg>',
        width, height, width, height, title, title, points,
        "var(--error-fg, #ba2121)" if any(values) else "var(--body-quiet-color, #666)",
    )
