"""Overrides in the admin: inline on their policy's page, and listed on their own across policies."""

from __future__ import annotations

from django.contrib import admin

from ..models import Override


class OverrideInline(admin.TabularInline):
    model = Override
    extra = 0
    fields = ("kind", "user", "group", "network", "header", "value", "exempt", "limit", "expires_at", "reason")
    autocomplete_fields = ("user", "group")


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
