"""The models: Policy (one named rate limit), Override (a different limit for some subjects),
ActionCost (how many units a request of an action takes), and Plan (limits over several policies for
the subjects assigned to it)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from . import strategies
from .periods import LABELS as PERIOD_LABELS
from .periods import zone
from .rates import MAX_WINDOW
from .subjects import TOKEN, KeySpecError, ip_network, mask, parse_key_spec

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})
OPTION_NAMES = {"bucket_size": "bucket size", "burst": "burst"}  # the fields only some strategies read
MAX_COST = 2**31 - 1  # what every database stores in an integer column

# the strategies of the registry (strategies/) as Django choices, one member each by its upper-case name
Strategy = models.TextChoices("Strategy", [(name.upper(), (name, label)) for name, label in strategies.choices()])


class Source(models.TextChoices):
    ADMIN = "admin", "Admin"
    CODE = "code", "Code"


class Mode(models.TextChoices):
    ENFORCE = "enforce", "Enforce (deny with 429)"
    SHADOW = "shadow", "Shadow (count and report only)"


def validate_key_spec(value: str) -> None:
    try:
        parse_key_spec(value)
    except KeySpecError as error:
        raise ValidationError(str(error), code="invalid_key") from error


def validate_action(value: str) -> None:
    if not value.strip() or any(char.isspace() for char in value):
        raise ValidationError(
            "An action is '*', a path prefix such as '/api/', or a name such as 'demo:search'; "
            "it cannot be empty or contain spaces.",
            code="invalid_action",
        )


def actions_overlap(first: str, second: str) -> bool:
    """Whether one request can meet both actions: '*' meets every request, two path prefixes meet when
    one starts the other ('/api/' and '/api/v1/'), a name meets itself. A name and a path prefix are not
    compared: which paths a URL name resolves from is known only per request (the tester shows it)."""
    if first == "*" or second == "*" or first == second:
        return True
    return first.startswith("/") and second.startswith("/") and (first.startswith(second) or second.startswith(first))


def never_admitted(action: str, cost: int, policy_name: str, capacity: int) -> str:
    return (
        f"A request of {action!r} costs {cost} units, more than policy {policy_name!r} allows at once "
        f"({capacity}): it could never be admitted."
    )


def parse_methods(value: str) -> frozenset[str]:
    """'post, PUT' -> {'POST', 'PUT'}; blank -> empty set, meaning every method."""
    return frozenset(part.strip().upper() for part in value.split(",") if part.strip())


def validate_time_zone(value: str) -> None:
    if value:
        try:
            zone(value)
        except ValueError as error:
            raise ValidationError(str(error), code="invalid_time_zone") from error


def validate_methods(value: str) -> None:
    unknown = sorted(parse_methods(value) - HTTP_METHODS)
    if unknown:
        raise ValidationError(
            "Unknown HTTP method(s): %(unknown)s. Use a comma list such as 'POST,PUT', or leave blank for all.",
            params={"unknown": ", ".join(unknown)},
            code="invalid_methods",
        )


class Policy(models.Model):
    name = models.SlugField(
        "name",
        max_length=64,
        unique=True,
        help_text="Unique slug shown in the RateLimit headers and the admin, e.g. 'search-per-ip'.",
    )
    action = models.CharField(
        "action",
        max_length=200,
        validators=[validate_action],
        help_text=(
            "What it protects: '*' for every request; a path prefix starting with '/', e.g. '/api/'; "
            "or a name: a URL name ('demo:search'), a DRF view's throttle_scope ('items') or the action "
            "given to @ratelimit('login')."
        ),
    )
    limit = models.PositiveIntegerField(
        "limit",
        validators=[MinValueValidator(1, "The limit must be at least 1 request per window.")],
        help_text=strategies.field_help("limit", "Requests allowed per window, e.g. 100."),
    )
    window = models.PositiveIntegerField(
        "window (seconds)",
        validators=[
            MinValueValidator(1, "The window must be at least 1 second."),
            MaxValueValidator(MAX_WINDOW, "The window can be at most one year (31622400 seconds)."),
        ],
        help_text=strategies.field_help("window", "Length of the window in seconds, e.g. 60 for a minute, 3600 for an hour."),
    )
    strategy = models.CharField(
        "strategy",
        max_length=20,
        choices=Strategy.choices,
        default=strategies.DEFAULT,
        help_text=strategies.help_text(),
    )
    key = models.CharField(
        "counted per",
        max_length=200,
        default="ip",
        validators=[validate_key_spec],
        help_text=(
            "Who is counted: ip, user, user_or_ip, header:<Name> (e.g. header:X-Api-Key), "
            "param:<name> (e.g. param:username), global; a comma list counts combinations, "
            "e.g. 'ip,header:User-Agent'."
        ),
    )
    methods = models.CharField(
        "methods",
        max_length=100,
        blank=True,
        validators=[validate_methods],
        help_text="Comma list of HTTP methods it applies to, e.g. 'POST,PUT'. Blank for all methods.",
    )
    mode = models.CharField(
        "mode",
        max_length=10,
        choices=Mode.choices,
        default=Mode.ENFORCE,
        help_text="enforce denies with 429 over the limit; shadow only counts and reports what it would deny.",
    )
    enabled = models.BooleanField("enabled", default=True, help_text="Disabled policies are ignored.")
    bucket_size = models.PositiveIntegerField(
        "bucket size (seconds)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1, "The bucket size must be at least 1 second.")],
        help_text=strategies.option_help("bucket_size"),
    )
    burst = models.PositiveIntegerField(
        "burst",
        null=True,
        blank=True,
        validators=[MinValueValidator(1, "The burst must be at least 1 request.")],
        help_text=strategies.option_help("burst"),
    )
    period = models.CharField(
        "calendar period",
        max_length=5,
        blank=True,
        default="",
        db_default="",
        choices=[(name, label) for name, label in PERIOD_LABELS.items()],
        help_text=strategies.option_help("period"),
    )
    time_zone = models.CharField(
        "time zone",
        max_length=64,
        blank=True,
        default="",
        db_default="",
        validators=[validate_time_zone],
        help_text=strategies.option_help("time_zone"),
    )
    source = models.CharField(
        "source",
        max_length=10,
        choices=Source.choices,
        db_default=Source.ADMIN,
        editable=False,
        help_text="Where the policy was declared: in the admin, or in code (@ratelimit(rate=...), RATELIMIT_POLICIES).",
    )
    code_values = models.JSONField(
        "values in code",
        null=True,
        blank=True,
        editable=False,
        help_text="For a policy from code: the values the code declares (limit, window, mode, ...), to revert to.",
    )
    description = models.TextField("description", blank=True, help_text="Why this policy exists, for other operators.")
    generation = models.PositiveIntegerField(
        "generation",
        default=0,
        editable=False,
        help_text="Bumped by 'reset all': counters of older generations are no longer read and expire.",
    )
    created = models.DateTimeField("created", auto_now_add=True)
    updated = models.DateTimeField("updated", auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "policy"
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        super().clean()
        strategy = strategies.STRATEGIES.get(self.strategy)
        if strategy is None:
            return  # the strategy field reports its own error
        for option, shown in OPTION_NAMES.items():
            if option not in strategy.options and getattr(self, option) is not None:
                users = " or ".join(strategies.using(option))
                raise ValidationError({option: f"The {shown} applies to {users} only; leave it blank."})
        for option in ("period", "time_zone"):
            if option not in strategy.options and getattr(self, option):
                users = " or ".join(strategies.using(option))
                raise ValidationError({option: (
                    f"{self.strategy} counts in a window of seconds, not by the calendar: choose the {users} "
                    f"strategy for a calendar period, or leave the {option.replace('_', ' ')} blank."
                )})
        strategy.clean(self)

    def validate_constraints(self, exclude=None) -> None:
        super().validate_constraints(exclude)
        # a check across rows, like uniqueness: the admin and the import make it, loading the index
        # (which skips constraints) does not, so a cost added by other means never hides a policy
        if not (self.enabled and self.mode == Mode.ENFORCE and self.action and self.limit):
            return  # a shadow or disabled policy denies nothing; a missing field reports its own error
        capacity, field = self.capacity()
        costs = ActionCost.objects.filter(cost__gt=capacity).order_by("-cost", "action")
        costliest = next((c for c in costs if actions_overlap(c.action, self.action)), None)
        if costliest is None:
            return
        remedy = (
            "Choose another strategy" if field == "strategy"
            else f"Raise the {OPTION_NAMES.get(field, field)} to at least {costliest.cost}"
        )
        message = never_admitted(costliest.action, costliest.cost, self.name, capacity) + f" {remedy}, or lower the action's cost."
        raise ValidationError({NON_FIELD_ERRORS if field in (exclude or ()) else field: message})

    def capacity(self) -> tuple[int, str]:
        """Units one request may take, and the field that says so: the limit, a smaller burst, or the
        strategy (its bound on one request's cost)."""
        strategy = strategies.STRATEGIES.get(self.strategy)
        burst = strategy.burst(self) if strategy else None
        found = (burst, "burst") if burst and burst < self.limit else (self.limit, "limit")
        most = strategy.most if strategy else None
        return (most, "strategy") if most and most < found[0] else found

    @property
    def methods_set(self) -> frozenset[str]:
        return parse_methods(self.methods)


class ActionCost(models.Model):
    """How many units of every policy that applies a request of one action takes (1 without a row)."""

    action = models.CharField(
        "action",
        max_length=200,
        unique=True,
        validators=[validate_action],
        help_text=(
            "The requests it prices, matched like a policy's action: '*' for every request; a path prefix "
            "starting with '/', e.g. '/api/export/'; or a name: a URL name ('demo:search'), a DRF view's "
            "throttle_scope ('items') or the action given to @ratelimit('login')."
        ),
    )
    cost = models.PositiveIntegerField(
        "cost",
        validators=[
            MinValueValidator(1, "A request costs at least 1 unit."),
            MaxValueValidator(MAX_COST, f"The cost can be at most {MAX_COST}."),
        ],
        help_text=(
            "Units a request of this action takes from every policy that applies to it (1 = an ordinary "
            "request). When the view's code also sets a cost (@ratelimit(cost=...), a DRF view's "
            "throttle_cost), this one wins: operators change it without a deploy."
        ),
    )
    note = models.TextField("note", blank=True, help_text="Why it costs this much, for other operators, e.g. 'one search = 5 queries'.")
    updated = models.DateTimeField("updated", auto_now=True)

    class Meta:
        ordering = ["action"]
        verbose_name = "action cost"
        verbose_name_plural = "action costs"

    def __str__(self) -> str:
        return f"{self.action}: {self.cost} {'unit' if self.cost == 1 else 'units'}"

    def validate_constraints(self, exclude=None) -> None:
        super().validate_constraints(exclude)
        # across rows, as Policy.validate_constraints: a cost no enforcing policy can admit is refused here
        if not (self.action and self.cost) or self.cost == 1:
            return
        bounded = [s.name for s in strategies.STRATEGIES.values() if s.most and s.most < self.cost]
        smaller = models.Q(limit__lt=self.cost) | models.Q(burst__lt=self.cost) | models.Q(strategy__in=bounded)
        policies = Policy.objects.filter(smaller, enabled=True, mode=Mode.ENFORCE)
        blocking = [
            (capacity, policy.name)
            for policy in policies.order_by("name")
            if actions_overlap(policy.action, self.action) and (capacity := policy.capacity()[0]) < self.cost
        ]
        if blocking:
            capacity, name = min(blocking)
            message = never_admitted(self.action, self.cost, name, capacity)
            raise ValidationError({NON_FIELD_ERRORS if "cost" in (exclude or ()) else "cost": message})


class MatchKind(models.TextChoices):
    USER = "user", "User"
    IP = "ip", "IP address or network"
    HEADER = "header", "Header value (e.g. an API key)"
    GROUP = "group", "User group"


def validate_network(value: str) -> None:
    try:
        ip_network(value)
    except ValueError as error:
        raise ValidationError(
            "Enter an IP address or a network in CIDR form, e.g. 203.0.113.7 or 10.0.0.0/8 or 2001:db8::/48.",
            code="invalid_network",
        ) from error


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
    reason = models.CharField("reason", max_length=200, blank=True, help_text="Why, e.g. 'partner integration, ticket 123'.")
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
        required = {MatchKind.USER: "user", MatchKind.GROUP: "group", MatchKind.IP: "network", MatchKind.HEADER: "header"}
        field = required.get(self.kind)
        if field and not (getattr(self, f"{field}_id", None) if field in ("user", "group") else getattr(self, field)):
            errors[field] = f"Required when it matches by {self.kind}."
        if self.kind == MatchKind.HEADER and not self.value:
            errors["value"] = "Required when it matches a header value."
        if self.kind == MatchKind.HEADER and self.header and not TOKEN.match(self.header.strip()):
            errors["header"] = f"{self.header[:40]!r} is not an HTTP header name (no spaces or separators), e.g. X-Api-Key."
        if self.kind == MatchKind.IP and self.network:
            self.network = canonical_network(self.network)
        return errors


class LimitField(models.PositiveIntegerField):
    """A limit in place of a policy's: blank when exempt, else from 1 to what every database stores;
    its form field says so in those words."""

    MIN_MESSAGE = "The limit must be at least 1 request per window."
    MAX_MESSAGE = f"The limit can be at most {MAX_COST} per window."
    default_validators = [MinValueValidator(1, MIN_MESSAGE), MaxValueValidator(MAX_COST, MAX_MESSAGE)]

    def formfield(self, **kwargs):
        messages = {"min_value": self.MIN_MESSAGE, "max_value": self.MAX_MESSAGE}
        return super().formfield(**{"min_value": 1, "max_value": MAX_COST, "error_messages": messages, **kwargs})


def limit_field(help_text: str) -> LimitField:
    return LimitField("limit", null=True, blank=True, help_text=help_text)


def exemption_errors(exempt: bool, limit: int | None, what: str) -> dict[str, str]:
    if exempt and limit:
        return {"limit": f"An exempt {what} has no limit: clear the limit or untick exempt."}
    if not exempt and not limit:
        return {"limit": "Give a limit, or tick exempt."}
    return {}


class Override(SubjectMatch):
    """A different limit, or an exemption, for one subject (or a network or group) under one policy."""

    policy = models.ForeignKey(
        Policy, on_delete=models.CASCADE, related_name="overrides", verbose_name="policy", help_text="The policy it changes."
    )
    exempt = models.BooleanField("exempt", default=False, help_text="Matching requests are not limited by this policy at all.")
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


class Plan(models.Model):
    """A named set of limits (or exemptions) over several policies, for the subjects assigned to it."""

    name = models.SlugField(
        "name", max_length=64, unique=True, help_text="Unique slug shown in the admin and the tester, e.g. 'pro'."
    )
    description = models.TextField("description", blank=True, help_text="What the plan is, e.g. 'paying customers, 10x the free limits'.")
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

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="limits", verbose_name="plan", help_text="The plan it belongs to.")
    policy = models.ForeignKey(
        Policy, on_delete=models.CASCADE, related_name="plan_limits", verbose_name="policy", help_text="The policy whose limit the plan sets."
    )
    exempt = models.BooleanField("exempt", default=False, help_text="Subjects on the plan are not limited by this policy at all.")
    limit = limit_field("The limit per window of the policy for subjects on the plan, e.g. 10000. Leave blank when exempt.")

    class Meta:
        ordering = ["plan__name", "policy__name"]
        verbose_name = "plan limit"
        verbose_name_plural = "plan limits"
        constraints = [
            models.UniqueConstraint(
                fields=["plan", "policy"], name="ratelimit_plan_limit_once", violation_error_message="The plan already sets a limit for this policy."
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
        Plan, on_delete=models.CASCADE, related_name="assignments", verbose_name="plan", help_text="The plan they are on."
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


def canonical_network(value: str) -> str:
    """'10.1.2.3/16' -> '10.1.0.0/16', '10.0.0.1/32' -> '10.0.0.1', '::ffff:203.0.113.7' -> '203.0.113.7'
    (the form client addresses are matched in); an invalid value is left as it is."""
    try:
        network = ip_network(value)
    except ValueError:
        return value  # the field's validator reports it
    return str(network.network_address) if network.prefixlen == network.max_prefixlen else str(network)


class QuotaUsage(models.Model):
    """What a subject used of a calendar quota in one period, saved from Redis every few seconds: a
    period Redis lost starts again from here, and billing reads it."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="quota_usage", verbose_name="policy")
    subject = models.CharField("subject key", max_length=64, help_text="The subject's hash, as Redis keys carry it.")
    display = models.CharField("subject", max_length=100, help_text="The subject as a person reads it, secrets masked.")
    period_start = models.DateTimeField("period start", help_text="When the calendar period began (UTC).")
    used = models.PositiveBigIntegerField("used", help_text="Units counted in the period.")
    updated = models.DateTimeField("saved", auto_now=True)

    class Meta:
        ordering = ["policy", "-period_start", "-used"]
        verbose_name = "quota usage"
        verbose_name_plural = "quota usage"
        constraints = [models.UniqueConstraint(fields=["policy", "subject", "period_start"], name="ratelimit_quota_usage_once")]
        indexes = [models.Index(fields=["policy", "period_start"], name="ratelimit_quota_usage_period")]

    def __str__(self) -> str:
        return f"{self.policy}: {self.display} used {self.used} from {self.period_start:%Y-%m-%d}"
