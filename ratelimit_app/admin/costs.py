"""Action costs in the admin: how many units a request to an action takes from every policy it meets."""

from __future__ import annotations

from django.contrib import admin

from ..models import ActionCost


@admin.register(ActionCost)
class ActionCostAdmin(admin.ModelAdmin):
    list_display = ("action", "cost", "note")
    search_fields = ("action",)
    readonly_fields = ("updated",)
