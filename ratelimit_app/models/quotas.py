"""What subjects used of their calendar quotas, saved from Redis."""

from __future__ import annotations

from django.db import models

from ..values import REQUESTS
from .policy import Policy
from .validators import UNIT_LENGTH


class QuotaUsage(models.Model):
    """What a subject used of a calendar quota in one period, saved from Redis every few seconds: a
    period Redis lost starts again from here, and billing reads it."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="quota_usage", verbose_name="policy")
    subject = models.CharField("subject key", max_length=64, help_text="The subject's hash, as Redis keys carry it.")
    display = models.CharField("subject", max_length=100, help_text="The subject as a person reads it, secrets masked.")
    period_start = models.DateTimeField("period start", help_text="When the calendar period began (UTC).")
    used = models.PositiveBigIntegerField("used", help_text="Units counted in the period, in its unit.")
    unit = models.CharField(
        "unit",
        max_length=UNIT_LENGTH,
        default=REQUESTS,
        db_default=REQUESTS,
        help_text="What `used` counts: the policy's unit when it was counted. A policy whose unit changed within "
        "a period has a row for each unit: what one counted never starts the other's counter.",
    )
    limit = models.PositiveBigIntegerField(
        "limit",
        null=True,
        blank=True,
        help_text="The subject's limit when its usage was last saved (its plan's or an override's, else the "
        "policy's): what the overage is measured against. Blank for usage saved before it was kept.",
    )
    kept = models.PositiveBigIntegerField(
        "kept", db_default=0, help_text="What the subject had used of the period when an operator reset it: its usage "
        "stays at least this (billing keeps it) while the counter starts afresh.",
    )
    updated = models.DateTimeField("saved", auto_now=True)

    class Meta:
        ordering = ["policy", "-period_start", "-used"]
        verbose_name = "quota usage"
        verbose_name_plural = "quota usage"
        constraints = [
            models.UniqueConstraint(
                fields=["policy", "subject", "period_start", "unit"], name="ratelimit_quota_usage_once"
            )
        ]
        indexes = [models.Index(fields=["policy", "period_start"], name="ratelimit_quota_usage_period")]

    def __str__(self) -> str:
        return f"{self.policy}: {self.display} used {self.used} {self.unit} from {self.period_start:%Y-%m-%d}"

    @property
    def limit_in_effect(self) -> int:
        """The limit saved with the usage, or the policy's for usage saved before limits were."""
        return self.policy.limit if self.limit is None else self.limit

    @property
    def overage(self) -> int:
        """Units used beyond the limit (a request settled more than its estimate): billed apart."""
        return max(self.used - self.limit_in_effect, 0)
