"""Plans: limits (or exemptions) over several policies, for the subjects assigned to them."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from .fields import limit_field
from .overrides import SubjectMatch, exemption_errors
from .policy import Policy


class Plan(models.Model):
    """A named set of limits (or exemptions) over several policies, for the subjects assigned to it."""

    name = models.SlugField(
        "name", max_length=64, unique=True, help_text="Unique slug shown in the admin and the tester, e.g. 'pro'."
    )
    description = models.TextField(
        "description", blank=True, help_text="What the plan is, e.g. 'paying customers, 10x the free limits'."
    )
    created = models.DateTimeField("created", auto_now_add=True)
    updated = models.DateTimeField("updated", auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "plan"
        verbose_name_plural = "plans"

    def __str__(self) -> str:
        return self.name


class PlanLimit(models.Model):
    """The limit (or an exemption) a plan gives its subjects under one policy."""

    plan = models.ForeignKey(
        Plan, on_delete=models.CASCADE, related_name="limits", verbose_name="plan", help_text="The plan it belongs to."
    )
    policy = models.ForeignKey(
        Policy, on_delete=models.CASCADE, related_name="plan_limits", verbose_name="policy",
        help_text="The policy whose limit the plan sets.",
    )
    exempt = models.BooleanField(
        "exempt", default=False, help_text="Subjects on the plan are not limited by this policy at all."
    )
    limit = limit_field(
        "The limit per window of the policy for subjects on the plan, e.g. 10000. Leave blank when exempt."
    )

    class Meta:
        ordering = ["plan__name", "policy__name"]
        verbose_name = "plan limit"
        verbose_name_plural = "plan limits"
        constraints = [
            models.UniqueConstraint(
                fields=["plan", "policy"], name="ratelimit_plan_limit_once",
                violation_error_message="The plan already sets a limit for this policy.",
            )
        ]

    def __str__(self) -> str:
        effect = "exempt" if self.exempt else f"limit {self.limit}"
        return f"{self.plan_id and self.plan.name}: {self.policy_id and self.policy.name} -> {effect}"

    def clean(self) -> None:
        super().clean()
        errors = exemption_errors(self.exempt, self.limit, "plan limit")
        if errors:
            raise ValidationError(errors)


class PlanAssignment(SubjectMatch):
    """Puts the requests of a user, a group's members, an API key (a header value) or a network on a plan."""

    plan = models.ForeignKey(
        Plan, on_delete=models.CASCADE, related_name="assignments", verbose_name="plan",
        help_text="The plan they are on.",
    )

    class Meta:
        ordering = ["plan__name", "kind", "pk"]
        verbose_name = "plan assignment"
        verbose_name_plural = "plan assignments"

    def __str__(self) -> str:
        return f"{self.matcher_display()} -> plan {self.plan_id and self.plan.name}"

    def clean(self) -> None:
        super().clean()
        errors = self.match_errors()
        if errors:
            raise ValidationError(errors)
