"""The policy admin's live page: who is being counted now, the trend of the last hour, and resets."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import DatabaseError
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse

from .. import operations, policies, strategies
from ..boundary import LIVE, protected
from ..engine import RedisUnavailable
from ..rates import human_limit, human_per, human_window
from ..values import REQUESTS
from .pages import PolicyPage


class LivePage(PolicyPage):
    """The page, or its data as JSON (`?format=json`, which the page's script reads every few seconds)."""

    def get(self, request, pk: int):
        try:
            return self.page(request, pk)
        except DatabaseError as error:  # the page stays an answer while the database is away, not a 500
            message = f"The database cannot be read now ({error}); this page shows again once it can."
            if request.GET.get("format") == "json":
                return JsonResponse({"error": message}, status=503)
            return HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")

    def page(self, request, pk: int):
        policy = self.policy(pk)
        data, status = live_snapshot(policy, rows=shown_rows(request))
        data["trend"] = [] if "error" in data else trend_data(policy)
        data["policies"] = policies_in_force()
        if request.GET.get("format") == "json":
            return JsonResponse(data, status=status)
        per = human_per(policy.window, policy.period, policy.time_zone or settings.TIME_ZONE)
        plan_limits = policy.plan_limits.select_related("plan").order_by("plan__name")
        return self.render(
            "live.html",
            status,
            original=policy,
            title=f"Live usage: {policy.name}",
            data=data,
            rate=self.model_admin.rate(policy),
            window=human_window(policy.window),
            metered=policy.unit != REQUESTS,  # the table counts its unit, grouped like the rest of the page
            can_reset=self.model_admin.has_change_permission(request, policy),
            exempt=list(policy.overrides.filter(exempt=True).select_related("user", "group")),
            plans=[(row, "exempt" if row.exempt else human_limit(row.limit, policy.unit, per)) for row in plan_limits],
            # an in-flight policy counts requests in progress, until their leases end
            in_flight=policy.strategy in strategies.STRATEGIES and strategies.get(policy.strategy).holds,
        )


class ResetPage(PolicyPage):
    """The live page's reset buttons: one subject (as listed, or as typed), or every subject."""

    def get(self, request, pk: int):
        return self.back_to(pk)

    def post(self, request, pk: int):
        policy = self.policy(pk, change=True)
        subject = request.POST.get("subject", "").strip()
        try:
            if subject:
                shown, _had_counts = operations.reset_subject(policy, subject)  # as the server knows it
                message = f"Counts of subject {shown} reset for {policy.name}."
            else:
                operations.reset_all(policy)
                message = f"Counts of every subject reset for {policy.name}."
        except RedisUnavailable as error:
            self.say(f"Nothing was reset: Redis is unreachable ({error}).", messages.ERROR)
        except ValidationError as error:
            self.say(f"Nothing was reset: {' '.join(error.messages)}", messages.ERROR)
        else:
            self.model_admin.log_change(request, policy, message)
            self.say(message, messages.SUCCESS)
        return self.back_to(pk)

    def back_to(self, pk: int) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:ratelimit_app_policy_live", args=[pk]))


def _unreadable(error: BaseException) -> tuple[dict, int]:
    return {"error": f"The live data cannot be read now ({type(error).__name__}: {error})."}, 503


# the operator's reads, inside the limiter's boundary: a failure shows on the page, never as a 500
live_snapshot = protected(operations.live_snapshot, LIVE, _unreadable)
trend_data = protected(operations.trend_data, LIVE, lambda _error: [])


def policies_in_force() -> dict:
    """How old the policies this worker enforces are, and why it could not read them again if so."""
    age, failure = policies.index_age(), policies.load_failure()
    return {"loaded_ago": None if age is None else round(age), "error": None if failure is None else str(failure)}


def shown_rows(request) -> int:
    """How many subjects the page lists: `?limit=` (1 to 1000), 100 by default."""
    try:
        return max(1, min(int(request.GET.get("limit", operations.LIVE_ROWS)), 1000))
    except ValueError:
        return operations.LIVE_ROWS
