"""The policy admin: the list with its activity columns, bulk actions through save(), and policies
declared in code (marked, their code's fields read-only, revertible). Its extra pages are views of
their own (pages.py, live_page.py); get_urls() routes them."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import NestedObjects, quote, unquote
from django.core.exceptions import ValidationError
from django.db import router
from django.db.models import Count
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html
from django.utils.text import capfirst

from .. import operations, registry, strategies
from ..checks.routes import unrouted
from ..engine import RedisUnavailable
from ..models import Mode, Policy, QuotaUsage
from ..rates import figure, format_rate, human_limit, human_window
from ..values import REQUESTS
from .forms import PolicyForm, PolicyListForm
from .live_page import LivePage, ResetPage
from .overrides import OverrideInline
from .pages import ChangesPage, RevertPage, TesterPage

UNKNOWN = "?"  # shown in the list when Redis cannot tell
INVALID = "invalid"  # shown in the list for a row that fails validation (it is not enforced)


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    form = PolicyForm
    list_display = (
        "name", "origin", "action", "rate", "strategy", "key", "mode", "enabled",
        "active_now", "denied_now", "denials_trend", "live_link",
    )
    list_editable = ("mode", "enabled")
    list_filter = ("strategy", "unit", "mode", "enabled")
    search_fields = ("name", "action", "key", "description")
    actions = ("enable", "disable", "make_shadow", "make_enforce", "reset_counts", "revert_to_code")
    inlines = (OverrideInline,)
    readonly_fields = ("generation", "created", "updated")
    fieldsets = (
        (None, {"fields": ("name", "description", "enabled", "mode")}),
        ("What it protects", {"fields": ("action", "methods")}),
        ("How much", {"fields": (
            "rate", "limit", "window", "unit", "overage_cap", "strategy", "bucket_size", "burst", "period", "time_zone",
            "key",
        )}),
        ("Bookkeeping", {"classes": ("collapse",), "fields": ("generation", "created", "updated")}),
    )

    # --- list -----------------------------------------------------------------------------------

    @admin.display(description="limit", ordering="limit")
    def rate(self, policy: Policy) -> str:
        kind = strategies.STRATEGIES.get(policy.strategy)
        over = kind.counts_over(policy) if kind is not None else None
        if over:  # a calendar quota's period, not its window
            return human_limit(policy.limit, policy.unit, over)
        burst = f", burst {figure(policy.burst, policy.unit)}" if policy.burst else ""
        return human_limit(policy.limit, policy.unit, human_window(policy.window)) + burst

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
        denied = [point.denied for point in trend]
        return sparkline(denied, f"{sum(denied)} denied in the last {human_window(policy.window * len(trend))}")

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
                said = f"{policy.name} was not changed: {' '.join(error.messages)}"
                self.message_user(request, said, messages.ERROR)
                continue
            policy.save()
            fields = [Policy._meta.get_field(field).verbose_name for field in changes]
            self.log_change(request, policy, [{"changed": {"fields": fields}}])
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
        unit = values.get("unit", REQUESTS)
        rate += "" if unit == REQUESTS else f" {unit}"  # '20000/m tokens'
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

    def get_deleted_objects(self, objs, request):
        """What deleting these policies takes, as Django's confirmation lists it, with each quota's saved usage
        in one line that counts its rows: it goes with its policy without a permission of its own (its admin
        is read only, so nobody deletes a row of it alone), and a million rows would not fit on the page."""
        collector = _UsageCounted(using=router.db_for_write(Policy), origin=objs)
        collector.collect(objs)
        perms_needed: set[str] = set()

        def shown(obj) -> str:
            return _deleted_line(obj, request, self.admin_site, perms_needed)

        usage = dict(
            QuotaUsage.objects.using(collector.using).filter(policy__in=[policy.pk for policy in objs])
            .values("policy").annotate(rows=Count("pk")).values_list("policy", "rows")
        )
        to_delete = _listed(collector.nested(), shown, usage)
        counts = {model._meta.verbose_name_plural: len(found) for model, found in collector.model_objs.items()}
        if usage:
            counts[QuotaUsage._meta.verbose_name_plural] = sum(usage.values())
        return to_delete, counts, perms_needed, [shown(obj) for obj in collector.protected]

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

    # --- a policy that never applies ---------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if request.method == "GET":
            self._warn_if_unrouted(request, self.get_object(request, unquote(object_id)))
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if "_continue" not in request.POST:  # else the change page it goes back to says it
            self._warn_if_unrouted(request, obj)

    def _warn_if_unrouted(self, request, policy: Policy | None) -> None:
        """Its action is valid, yet nothing the site routes meets it (W012): say so where it is edited."""
        problem = unrouted(policy.action) if policy is not None else None
        if problem:
            messages.warning(request, f"Policy {policy.name!r} never applies: {problem}. Fix its action, "
                             "or use the policy tester to see the names a path is known by.")

    # --- the extra pages, each a view of its own ---------------------------------------------------

    def get_urls(self):
        def page(view):
            return self.admin_site.admin_view(view.as_view(model_admin=self))

        return [
            path("<int:pk>/revert/", page(RevertPage), name="ratelimit_app_policy_revert"),
            path("<int:pk>/live/", page(LivePage), name="ratelimit_app_policy_live"),
            path("<int:pk>/live/reset/", page(ResetPage), name="ratelimit_app_policy_reset"),
            path("tester/", page(TesterPage), name="ratelimit_app_policy_tester"),
            path("changes/", page(ChangesPage), name="ratelimit_app_policy_changes"),
        ] + super().get_urls()


# --- what a delete takes ------------------------------------------------------------------------------


class _UsageCounted(NestedObjects):
    """The objects deleting policies takes, their saved quota usage left to the database: counted, not loaded."""

    def can_fast_delete(self, objs, from_field=None) -> bool:
        model = objs._meta.model if hasattr(objs, "_meta") else getattr(objs, "model", None)
        return model is QuotaUsage


def _deleted_line(obj, request, admin_site, perms_needed: set[str]) -> str:
    """One object of the confirmation page, as Django's admin shows it (a link to it where it has a page),
    noting the permission the user lacks to delete it."""
    opts = obj._meta
    plain = f"{capfirst(opts.verbose_name)}: {obj}"
    if not admin_site.is_registered(obj.__class__):
        return plain
    if not admin_site.get_model_admin(obj.__class__).has_delete_permission(request, obj):
        perms_needed.add(opts.verbose_name)
    try:
        url = reverse(f"{admin_site.name}:{opts.app_label}_{opts.model_name}_change", None, (quote(obj.pk),))
    except NoReverseMatch:
        return plain
    return format_html('{}: <a href="{}">{}</a>', capfirst(opts.verbose_name), url, obj)


def _listed(tree: list, shown, usage: dict[int, int]) -> list:
    """The nested list of objects as lines, a line of saved usage first under each policy that has some."""
    listed: list = []
    for item in tree:
        if not isinstance(item, list):
            listed.append(shown(item))
            if isinstance(item, Policy) and usage.get(item.pk):
                rows = usage[item.pk]
                listed.append([f"{capfirst(QuotaUsage._meta.verbose_name)}: {rows} saved row{'s' * (rows != 1)} "
                               "(what its subjects used, every period)"])
        elif listed and isinstance(listed[-1], list):  # the policy's usage line opened its list of what goes
            listed[-1].extend(_listed(item, shown, usage))
        else:
            listed.append(_listed(item, shown, usage))
    return listed


# --- the list's sparkline of denials -------------------------------------------------------------


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
