"""Policy (one named rate limit) and ActionCost (how many units a request of an action takes): each
checks the other across rows."""

from __future__ import annotations

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from .. import strategies
from ..periods import LABELS as PERIOD_LABELS
from ..rates import MAX_WINDOW
from .fields import MAX_COST, RegistryHelpCharField, RegistryHelpIntegerField, StrategyField, registry_text
from ..values import REQUESTS
from .validators import (
    UNIT_LENGTH, parse_methods, validate_action, validate_key_spec, validate_methods, validate_time_zone, validate_unit,
)

OPTION_NAMES = {"bucket_size": "bucket size", "burst": "burst"}  # the fields only some strategies read

# the strategies registered at import as an enum, for code that names one (Strategy.TOKEN_BUCKET); the
# model's field reads the registry itself
Strategy = models.TextChoices("Strategy", [(name.upper(), (name, label)) for name, label in strategies.choices()])


class Source(models.TextChoices):
    ADMIN = "admin", "Admin"
    CODE = "code", "Code"


class Mode(models.TextChoices):
    ENFORCE = "enforce", "Enforce (deny with 429)"
    SHADOW = "shadow", "Shadow (count and report only)"


def metered_meet(action: str) -> bool:
    """Whether an enabled metered policy meets requests of `action`: those take one request from each
    policy counting requests (each policy is charged in its own unit), so their cost never blocks one."""
    metered = Policy.objects.filter(enabled=True).exclude(unit=REQUESTS).values_list("action", flat=True)
    return any(actions_overlap(other, action) for other in metered)


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
    limit = RegistryHelpIntegerField(
        "limit",
        validators=[MinValueValidator(1, "The limit must be at least 1 request per window.")],
        help_text=registry_text(strategies.field_help, "limit", "Requests allowed per window, e.g. 100."),
    )
    window = RegistryHelpIntegerField(
        "window (seconds)",
        validators=[
            MinValueValidator(1, "The window must be at least 1 second."),
            MaxValueValidator(MAX_WINDOW, "The window can be at most one year (31622400 seconds)."),
        ],
        help_text=registry_text(
            strategies.field_help, "window", "Length of the window in seconds, e.g. 60 for a minute, 3600 for an hour."
        ),
    )
    strategy = StrategyField("strategy")
    unit = models.CharField(
        "unit",
        max_length=UNIT_LENGTH,
        default=REQUESTS,
        db_default=REQUESTS,
        validators=[validate_unit],
        help_text=(
            "What the limit counts: 'requests' (each request's cost, known before the view); 'content-bytes' "
            "(the bytes of each response, counted by the app); or a unit the view reports once it knows, "
            "e.g. 'tokens' with ratelimit_app.settle(request, tokens=1834). A request is admitted on its "
            "estimate (its cost) and then charged what it really used."
        ),
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
    overage_cap = models.PositiveIntegerField(
        "overage cap",
        null=True,
        blank=True,
        validators=[MaxValueValidator(MAX_COST, f"The overage cap can be at most {MAX_COST}.")],
        help_text=(
            "Metered units only: the most a request is charged beyond its estimate, e.g. 4000 tokens; what it "
            "used beyond that is not counted. Blank: everything it used (usage over the limit is debt, refused "
            "until it has left the window)."
        ),
    )
    bucket_size = RegistryHelpIntegerField(
        "bucket size (seconds)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1, "The bucket size must be at least 1 second.")],
        help_text=registry_text(strategies.option_help, "bucket_size"),
    )
    burst = RegistryHelpIntegerField(
        "burst",
        null=True,
        blank=True,
        validators=[MinValueValidator(1, "The burst must be at least 1 request.")],
        help_text=registry_text(strategies.option_help, "burst"),
    )
    period = RegistryHelpCharField(
        "calendar period",
        max_length=5,
        blank=True,
        default="",
        db_default="",
        choices=[(name, label) for name, label in PERIOD_LABELS.items()],
        help_text=registry_text(strategies.option_help, "period"),
    )
    time_zone = RegistryHelpCharField(
        "time zone",
        max_length=64,
        blank=True,
        default="",
        db_default="",
        validators=[validate_time_zone],
        help_text=registry_text(strategies.option_help, "time_zone"),
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
        strategy = self.registered_strategy
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
        if self.overage_cap is not None and self.unit == REQUESTS:
            raise ValidationError({"overage_cap": (
                "The overage cap applies to a metered unit (tokens, content-bytes...): a request's cost in "
                "requests is known before the view. Leave it blank, or choose the unit it caps."
            )})
        if self.unit != REQUESTS and not strategy.counts_units:
            raise ValidationError({"unit": (
                f"{self.strategy} cannot count {self.unit}: {strategy.unit_refusal}. Choose "
                f"{' or '.join(strategies.counting_units())}, or the unit 'requests'."
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
        costliest = next((c for c in costs if actions_overlap(c.action, self.action)
                          and not (self.unit == REQUESTS and metered_meet(c.action))), None)
        if costliest is None:
            return
        remedy = (
            "Choose another strategy" if field == "strategy"
            else f"Raise the {OPTION_NAMES.get(field, field)} to at least {costliest.cost}"
        )
        refused = never_admitted(costliest.action, costliest.cost, self.name, capacity)
        message = f"{refused} {remedy}, or lower the action's cost."
        raise ValidationError({NON_FIELD_ERRORS if field in (exclude or ()) else field: message})

    def capacity(self) -> tuple[int, str]:
        """Units one request may take, and the field that says so: the limit, a smaller burst, or the
        strategy (its bound on one request's cost)."""
        strategy = self.registered_strategy
        burst = strategy.burst(self) if strategy else None
        found = (burst, "burst") if burst and burst < self.limit else (self.limit, "limit")
        most = strategy.most if strategy else None
        return (most, "strategy") if most and most < found[0] else found

    @property
    def registered_strategy(self) -> strategies.Strategy | None:
        """The registry's strategy this policy counts with (None: a name no longer registered)."""
        return strategies.STRATEGIES.get(self.strategy)

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
    note = models.TextField(
        "note", blank=True, help_text="Why it costs this much, for other operators, e.g. 'one search = 5 queries'."
    )
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
        if metered_meet(self.action):  # then a policy counting requests takes one request of it
            policies = policies.exclude(unit=REQUESTS)
        blocking = [
            (capacity, policy.name)
            for policy in policies.order_by("name")
            if actions_overlap(policy.action, self.action) and (capacity := policy.capacity()[0]) < self.cost
        ]
        if blocking:
            capacity, name = min(blocking)
            message = never_admitted(self.action, self.cost, name, capacity)
            raise ValidationError({NON_FIELD_ERRORS if "cost" in (exclude or ()) else "cost": message})
