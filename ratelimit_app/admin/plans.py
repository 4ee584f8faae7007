"""Plans in the admin: a plan with its limits and who is on it, edited on one page."""

from __future__ import annotations

from django.contrib import admin

from ..models import Plan, PlanAssignment, PlanLimit


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
    search_fields = (
        "name", "description", "limits__policy__name", "assignments__user__username", "assignments__group__name"
    )
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
