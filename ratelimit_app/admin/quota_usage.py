"""The admin's quota usage: what each subject used of a calendar quota in the current and previous periods
(as the workers saved it), and its CSV export for billing, streamed so a million rows take little memory."""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from itertools import islice
from typing import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Q, QuerySet
from django.http import HttpResponseBadRequest, StreamingHttpResponse
from django.urls import path

from ..loading import compile_policy
from ..models import Policy, QuotaUsage
from ..periods import periods_at, zone
from ..quotas import as_instant, as_stored

CHUNK = 2000  # rows per database fetch of the export


def period_starts(which: str, now_ms: int | None = None) -> Q:
    """Rows of the current (or previous) period of every calendar quota, each in its own zone."""
    now_ms = int(datetime.now(timezone.utc).timestamp() * 1000) if now_ms is None else now_ms
    query = Q(pk__in=[])
    for row in Policy.objects.exclude(period=""):
        try:
            policy = compile_policy(row)
        except ValidationError:  # a bad row: the system checks report it
            continue
        found = periods_at(policy.period, zone(policy.time_zone), now_ms)
        start = found.start if which == "current" else found.previous
        query |= Q(policy=row, period_start=as_stored(start))
    return query


class PeriodFilter(admin.SimpleListFilter):
    title = "period"
    parameter_name = "period"

    def lookups(self, request, model_admin):
        return [("current", "Current period"), ("previous", "Previous period")]

    def queryset(self, request, queryset):
        return queryset.filter(period_starts(self.value())) if self.value() in ("current", "previous") else queryset


class _Echo:
    """A file that hands back what is written to it: csv.writer makes each row a string to stream."""

    def write(self, value: str) -> str:
        return value


COLUMNS = ["policy", "subject", "subject_key", "period_start", "used", "saved", "unit", "limit", "overage"]


def csv_rows(queryset: QuerySet) -> Iterator[str]:
    """The header, then a line per row; the columns added since the first ones go last, so that a reader of
    the first six finds them where they were."""
    writer = csv.writer(_Echo())
    yield writer.writerow(COLUMNS)
    rows = queryset.order_by("policy_id", "period_start", "pk").values_list(
        "policy__name", "display", "subject", "period_start", "used", "updated", "unit", "limit",
        "policy__limit",
    )
    for name, display, subject, start, used, saved, unit, limit, policy_limit in rows.iterator(chunk_size=CHUNK):
        # instants in UTC whichever way the database holds them (naive in TIME_ZONE with USE_TZ False)
        start, saved = as_instant(start).isoformat(), as_instant(saved).isoformat()
        limit = policy_limit if limit is None else limit  # usage saved before its limit was: the policy's
        yield writer.writerow([name, display, subject, start, used, saved, unit, limit, max(used - limit, 0)])


async def _chunked(rows: Iterator[str]) -> AsyncIterator[str]:
    """The export's lines, CHUNK at a time, read in the thread that runs the project's sync code (the
    database connection the rows are read through belongs to it)."""
    while True:
        chunk = await sync_to_async(_next_lines, thread_sensitive=True)(rows)
        if not chunk:
            return
        yield chunk


def _next_lines(rows: Iterator[str]) -> str:
    return "".join(islice(rows, CHUNK))


class ExportedRows(ChangeList):
    """The list's rows, by the list's own filters and search, without reading a page of them: the export's."""

    def get_results(self, request) -> None:
        pass


EXPORT = "ratelimit_app_quotausage_export"


@admin.register(QuotaUsage)
class QuotaUsageAdmin(admin.ModelAdmin):
    """Read only: the workers write usage; operators look at it and export it."""

    list_display = ("display", "policy", "period_start", "used", "limit_in_effect", "overage", "unit", "updated")
    list_filter = (PeriodFilter, "policy")
    search_fields = ("display", "subject")
    list_select_related = ("policy",)
    show_full_result_count = False  # a million rows: no second COUNT(*) per page
    change_list_template = "admin/ratelimit_app/quotausage/change_list.html"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_urls(self):
        export = self.admin_site.admin_view(self.export_view)
        return [path("export.csv", export, name=EXPORT), *super().get_urls()]

    def get_changelist(self, request, **kwargs):
        match = request.resolver_match
        return ExportedRows if match and match.url_name == EXPORT else super().get_changelist(request, **kwargs)

    def export_view(self, request):
        """The rows the list shows (same filters and search), as CSV, streamed."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:  # the filters the list has, read as it reads them: the export is what the list shows
            queryset = self.get_changelist_instance(request).queryset
        except IncorrectLookupParameters as error:  # the list says so with ?e=1; a download can only answer
            return HttpResponseBadRequest(f"The list's filters are not valid here: {error}", content_type="text/plain")
        rows = csv_rows(queryset)
        # an ASGI server lists a sync iterator whole before sending it: give it the rows a chunk at a time
        content = _chunked(rows) if isinstance(request, ASGIRequest) else rows
        response = StreamingHttpResponse(content, content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="quota-usage.csv"'
        return response
