"""What a policy declared in code is (@ratelimit(rate=...), RATELIMIT_POLICIES, the compat modules):
a validated CodePolicy, made without touching the database, and what a bad declaration says."""

from __future__ import annotations

import logging
import re
from hashlib import blake2b
from typing import Any, Iterable

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured, ValidationError

from .. import strategies
from ..conf import get_setting
from ..models import MAX_COST, Mode, Policy
from ..periods import PERIODS
from ..rates import format_rate, parse_quota, parse_rate
from ..values import REQUESTS

logger = logging.getLogger("ratelimit_app")

# How much a policy allows: taken from the code as one unit unless the operator changed any of it.
RATE_FIELDS = ("limit", "window", "strategy", "bucket_size", "burst", "period", "time_zone", "unit", "overage_cap")
# What an operator may change in the admin; the rest (what is protected, who is counted) is the code's.
OPERATOR_FIELDS = RATE_FIELDS + ("mode", "enabled")
CODE_FIELDS = ("action", "key", "methods") + OPERATOR_FIELDS
SETTING_KEYS = {
    "name", "action", "rate", "limit", "window", "key", "strategy", "methods", "mode", "enabled", "burst",
    "bucket_size", "description", "time_zone", "unit", "overage_cap",
}
NAME_LENGTH = 64
COMPUTED = "computed"  # in code_values: the code computes the limit per request (a callable rate)


class CodePolicy:
    """One policy as the code declares it: its name, the values of CODE_FIELDS, and where it was declared."""

    __slots__ = ("name", "values", "origin", "description", "create_only")

    def __init__(
        self, name: str, values: dict[str, Any], origin: str, description: str = "", create_only: bool = False
    ) -> None:
        self.name = name
        self.values = values
        self.origin = origin
        self.description = description
        # the row is created from these values but never updated from them: for a limit the code computes
        # per request (a callable rate), where each process may first see a different one
        self.create_only = create_only

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CodePolicy) and (self.name, self.values) == (other.name, other.values)

    __hash__ = None  # mutable registry entries are compared, never hashed

    def __repr__(self) -> str:
        rate = format_rate(self.values["limit"], self.values["window"])
        return f"<CodePolicy {self.name} {rate} {self.values['action']}>"


def code_policy(
    name: str,
    *,
    action: str,
    origin: str,
    rate: str | tuple[int, int] | None = None,
    limit: int | None = None,
    window: int | None = None,
    key: str = "ip",
    strategy: str | None = None,
    methods: str | Iterable[str] | None = "",
    mode: str = Mode.ENFORCE,
    enabled: bool = True,
    burst: int | None = None,
    bucket_size: int | None = None,
    description: str = "",
    create_only: bool = False,
    time_zone: str = "",
    unit: str = REQUESTS,
    overage_cap: int | None = None,
) -> CodePolicy:
    """A validated declaration, not registered (no database access); ImproperlyConfigured when a value is wrong."""
    if overage_cap is not None and (isinstance(overage_cap, bool) or not isinstance(overage_cap, int)):
        # the model field would read True as a cap of 1 unit and 2.5 as 2: bills cut short without a word
        raise ImproperlyConfigured(f"{origin}: overage_cap: {overage_cap!r} is not a whole number of units.")
    quota = parse_quota(rate)  # '10000/month': a calendar quota, counted by the quota strategy unless told
    limit, window = (quota[0], PERIODS[quota[1]]) if quota else _limit_and_window(origin, rate, limit, window)
    row = Policy(
        name=name, action=action, limit=limit, window=window, key=key,
        strategy=strategy or (strategies.calendar() if quota else strategies.DEFAULT),
        methods=_methods(methods), mode=mode, enabled=enabled, burst=burst, bucket_size=bucket_size,
        period=quota[1] if quota else "", time_zone=time_zone, unit=unit,
        overage_cap=overage_cap,
    )
    try:
        row.full_clean(exclude=["source"], validate_unique=False, validate_constraints=False)
    except ValidationError as error:
        raise ImproperlyConfigured(f"{origin}: {error_text(error)}") from error
    values = {field: getattr(row, field) for field in CODE_FIELDS}
    return CodePolicy(name, values, origin, description or f"Declared by {origin}.", create_only)


def _limit_and_window(origin: str, rate, limit, window) -> tuple[int, int]:
    if rate is not None:
        if limit is not None or window is not None:
            raise ImproperlyConfigured(f"{origin}: give either rate='5/m' or limit= and window=, not both.")
        try:
            return parse_rate(rate)
        except ValueError as error:
            raise ImproperlyConfigured(f"{origin}: {error}") from error
    if limit is None or window is None:
        raise ImproperlyConfigured(f"{origin}: give a rate such as rate='5/m', or both limit= and window= (seconds).")
    return limit, window


def _methods(methods: str | Iterable[str] | None) -> str:
    if not methods:
        return ""
    parts = methods.split(",") if isinstance(methods, str) else list(methods)
    return ",".join(part.strip().upper() for part in parts if part and part.strip())


def error_text(error: ValidationError) -> str:
    """A validation error in one line, each field named."""
    if hasattr(error, "message_dict"):
        return "; ".join(f"{field}: {' '.join(texts)}" for field, texts in error.message_dict.items())
    return " ".join(error.messages)


def slug_name(text: str, prefix: str = "") -> str:
    """A policy name (a slug of at most 64 characters) from a dotted path; long ones end in a short hash."""
    slug = prefix + re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(slug) <= NAME_LENGTH:
        return slug
    digest = blake2b(text.encode(), digest_size=4).hexdigest()
    return slug[: NAME_LENGTH - len(digest) - 1].rstrip("-") + "-" + digest



def capacity(values: dict[str, Any]) -> int:
    """What a policy of these values allows at once: its limit, or a token bucket's burst under it."""
    return Policy(**{field: values[field] for field in RATE_FIELDS}).capacity()[0]


def fixed_cost_problem(cost: Any) -> str | None:
    """What is wrong with a fixed cost given in code (None when it is usable): a whole number of units
    from 1 to MAX_COST, as the admin's action costs."""
    if isinstance(cost, bool) or not isinstance(cost, int):
        return f"{cost!r} is not a whole number of units"
    if cost < 1:
        return f"{cost} is less than 1 unit"
    if cost > MAX_COST:
        return f"{cost} is more than {MAX_COST} units"
    return None



def settings_policies(errors: list[str] | None = None) -> list[CodePolicy]:
    """The policies of RATELIMIT_POLICIES; a bad entry is skipped and reported in `errors` (or logged)."""
    found = []
    entries = get_setting("RATELIMIT_POLICIES") or ()
    for index, entry in enumerate(entries):
        origin = f"RATELIMIT_POLICIES[{index}]"
        try:
            found.append(_from_setting(entry, origin))
        except ImproperlyConfigured as error:
            if errors is None:
                logger.error("ratelimit: %s is skipped", error)
            else:
                errors.append(str(error))
    return found


def _from_setting(entry: Any, origin: str) -> CodePolicy:
    if not isinstance(entry, dict):
        example = "{'name': 'api', 'action': '/api/', 'rate': '100/m'}"
        raise ImproperlyConfigured(f"{origin}: each entry is a dict such as {example}.")
    unknown = sorted(set(entry) - SETTING_KEYS)
    if unknown:
        known = ", ".join(sorted(SETTING_KEYS))
        raise ImproperlyConfigured(f"{origin}: unknown key(s) {', '.join(unknown)}; known: {known}.")
    if not entry.get("name") or not entry.get("action"):
        raise ImproperlyConfigured(f"{origin}: 'name' and 'action' are required.")
    fields = {k: v for k, v in entry.items() if k != "name"}
    # not kept in the registry: the setting is read again at every sync, so override_settings works
    return code_policy(entry["name"], origin=f"{origin} ({entry['name']})", **fields)


@register()
def check_declared_policies(app_configs: object = None, **kwargs: object) -> list:
    """Bad RATELIMIT_POLICIES entries are reported by `manage.py check` (they are skipped at run time)."""
    errors: list[str] = []
    settings_policies(errors)
    hint = (
        "Fix the entry in your settings. Where checks do not run (e.g. under gunicorn) it is skipped, "
        "with a logged error."
    )
    return [Error(message, hint=hint, id="ratelimit_app.E010") for message in errors]

