"""Which requests a row matches (a user, a network, a header value, a group), and the overrides that
give them a different limit under one policy."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from ..subjects import TOKEN, mask
from .fields import limit_field
from .policy import Policy
from .validators import canonical_network, validate_network


class MatchKind(models.TextChoices):
    USER = "user", "User"
    IP = "ip", "IP address or network"
    HEADER = "header", "Header value (e.g. an API key)"
    GROUP = "group", "User group"


class SubjectMatch(models.Model):
    """Which requests a row matches: a user, an IP address or network, a header value (an API key) or
    a group's members, until an optional expiry. Overrides and plan assignments match alike (overrides.py)."""

    kind = models.CharField(
        "matches",
        max_length=10,
        choices=MatchKind.choices,
        help_text="What it matches: a user, an IP address or network, a header value, or a group.",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name="user",
        help_text="For 'user': the user whose requests it matches.",
    )
    group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name="group",
        help_text="For 'group': every member of this group.",
    )
    network = models.CharField(
        "IP address or network",
        max_length=64,
        blank=True,
        validators=[validate_network],
        help_text="For 'ip': an address (203.0.113.7) or a CIDR network (10.0.0.0/8, 2001:db8::/48).",
    )
    header = models.CharField(
        "header",
        max_length=100,
        blank=True,
        help_text="For 'header': the header name, e.g. X-Api-Key.",
    )
    value = models.CharField(
        "header value",
        max_length=500,
        blank=True,
        help_text="For 'header': the exact value, e.g. the API key. Shown masked in lists.",
    )
    expires_at = models.DateTimeField(
        "expires", null=True, blank=True, help_text="After this moment it no longer applies. Blank: never."
    )
    reason = models.CharField(
        "reason", max_length=200, blank=True, help_text="Why, e.g. 'partner integration, ticket 123'."
    )
    created = models.DateTimeField("created", auto_now_add=True)
    updated = models.DateTimeField("updated", auto_now=True)

    class Meta:
        abstract = True

    def matcher_display(self) -> str:
        if self.kind == MatchKind.USER:
            return f"user {self.user}" if self.user_id else "user ?"
        if self.kind == MatchKind.GROUP:
            return f"group {self.group}" if self.group_id else "group ?"
        if self.kind == MatchKind.IP:
            return f"ip {self.network}"
        return f"header {self.header}={mask(self.value)}"

    def match_errors(self) -> dict[str, str]:
        """What is missing or wrong for the row to match anything (the network is made canonical)."""
        errors: dict[str, str] = {}
        required = {
            MatchKind.USER: "user", MatchKind.GROUP: "group", MatchKind.IP: "network", MatchKind.HEADER: "header"
        }
        field = required.get(self.kind)
        if field and not (getattr(self, f"{field}_id", None) if field in ("user", "group") else getattr(self, field)):
            errors[field] = f"Required when it matches by {self.kind}."
        if self.kind == MatchKind.HEADER and not self.value:
            errors["value"] = "Required when it matches a header value."
        if self.kind == MatchKind.HEADER and self.header and not TOKEN.match(self.header.strip()):
            errors["header"] = (
                f"{self.header[:40]!r} is not an HTTP header name (no spaces or separators), e.g. X-Api-Key."
            )
        if self.kind == MatchKind.IP and self.network:
            self.network = canonical_network(self.network)
        return errors


def exemption_errors(exempt: bool, limit: int | None, what: str) -> dict[str, str]:
    if exempt and limit:
        return {"limit": f"An exempt {what} has no limit: clear the limit or untick exempt."}
    if not exempt and not limit:
        return {"limit": "Give a limit, or tick exempt."}
    return {}


class Override(SubjectMatch):
    """A different limit, or an exemption, for one subject (or a network or group) under one policy."""

    policy = models.ForeignKey(
        Policy, on_delete=models.CASCADE, related_name="overrides", verbose_name="policy",
        help_text="The policy it changes.",
    )
    exempt = models.BooleanField(
        "exempt", default=False, help_text="Matching requests are not limited by this policy at all."
    )
    limit = limit_field("The limit in effect instead of the policy's, per window, e.g. 1000. Leave blank when exempt.")

    class Meta:
        ordering = ["policy__name", "kind", "pk"]
        verbose_name = "override"
        verbose_name_plural = "overrides"

    def __str__(self) -> str:
        effect = "exempt" if self.exempt else f"limit {self.limit}"
        return f"{self.policy_id and self.policy.name}: {self.matcher_display()} -> {effect}"

    def clean(self) -> None:
        super().clean()
        errors = {**self.match_errors(), **exemption_errors(self.exempt, self.limit, "override")}
        if errors:
            raise ValidationError(errors)
