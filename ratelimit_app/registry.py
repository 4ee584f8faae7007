"""Policies declared in code (@ratelimit(rate=...), RATELIMIT_POLICIES, the compat modules), kept as
ordinary Policy rows marked source='code' so that every door, the live page and the admin treat them
alike. Declaring touches no database: it marks the policy index stale, and the index is built from the
rows merged with the declarations, so a worker enforces every declaration it knows from its first
request, whatever the database holds. Rows are written (an insert that never fails on a row another
worker wrote first) before the index loads and after migrate; an operator's change in the admin wins
over the code until it is reverted.
"""

from __future__ import annotations

import logging
import re
import threading
from hashlib import blake2b
from typing import Any, Callable, Iterable, Iterator, Sequence

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DatabaseError, transaction
from django.db.models.signals import post_migrate
from django.dispatch import receiver
from django.utils import timezone

from . import strategies
from .conf import get_setting
from .models import MAX_COST, Mode, Policy, Source
from .periods import PERIODS
from .rates import format_rate, parse_quota, parse_rate

logger = logging.getLogger("ratelimit_app")

# How much a policy allows: taken from the code as one unit unless the operator changed any of it.
RATE_FIELDS = ("limit", "window", "strategy", "bucket_size", "burst", "period", "time_zone")
# What an operator may change in the admin; the rest (what is protected, who is counted) is the code's.
OPERATOR_FIELDS = RATE_FIELDS + ("mode", "enabled")
CODE_FIELDS = ("action", "key", "methods") + OPERATOR_FIELDS
SETTING_KEYS = {"name", "action", "rate", "limit", "window", "key", "strategy", "methods", "mode", "enabled", "burst", "bucket_size", "description", "time_zone"}
NAME_LENGTH = 64
COMPUTED = "computed"  # in code_values: the code computes the limit per request (a callable rate)


class CodePolicy:
    """One policy as the code declares it: its name, the values of CODE_FIELDS, and where it was declared."""

    __slots__ = ("name", "values", "origin", "description", "create_only")

    def __init__(self, name: str, values: dict[str, Any], origin: str, description: str = "", create_only: bool = False) -> None:
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
        return f"<CodePolicy {self.name} {format_rate(self.values['limit'], self.values['window'])} {self.values['action']}>"


def declare_policy(name: str, **fields: Any) -> CodePolicy:
    """Validate a declaration (no database access) and add it to the registry; returns it.

    Takes the arguments of code_policy(); raises ImproperlyConfigured, naming the origin, when a value is wrong.
    """
    return register_policy(code_policy(name, **fields))


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
) -> CodePolicy:
    """A validated declaration, not registered (no database access); ImproperlyConfigured when a value is wrong."""
    quota = parse_quota(rate)  # '10000/month': a calendar quota, counted by the quota strategy unless told
    limit, window = (quota[0], PERIODS[quota[1]]) if quota else _limit_and_window(origin, rate, limit, window)
    row = Policy(
        name=name, action=action, limit=limit, window=window, key=key,
        strategy=strategy or (strategies.calendar() if quota else strategies.DEFAULT),
        methods=_methods(methods), mode=mode, enabled=enabled, burst=burst, bucket_size=bucket_size,
        period=quota[1] if quota else "", time_zone=time_zone,
    )
    try:
        row.full_clean(exclude=["source"], validate_unique=False, validate_constraints=False)
    except ValidationError as error:
        raise ImproperlyConfigured(f"{origin}: {_messages(error)}") from error
    return CodePolicy(name, {field: getattr(row, field) for field in CODE_FIELDS}, origin, description or f"Declared by {origin}.", create_only)


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


def _messages(error: ValidationError) -> str:
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


# --- the registry ------------------------------------------------------------------------------


class _Registry:
    def __init__(self) -> None:
        self.declared: dict[str, CodePolicy] = {}
        # functions returning declarations read from settings at each load (so override_settings works)
        self.providers: list[Callable[[], list[CodePolicy]]] = []
        self.written: set[str] = set()  # names whose rows hold their current declaration (written or found)
        self.pending = True  # some declaration may have no row yet (startup, a new declaration, new settings)
        # the URLconf in use is read before declarations are (its views declare first), at a process's
        # first request or after a reset or a new ROOT_URLCONF
        self.routes_pending = True
        self.costs: dict[str, tuple[int, str]] = {}  # action -> the largest fixed cost a view's code gives it, and where
        # the decorator's declarations per view, in order: kept after a reset, to be made again when a
        # URLconf routes to the view (its module is imported once, its decorators never run again)
        self.by_view: dict[str, list[CodePolicy]] = {}
        # told when declarations change (None) or rows were written (the database alias): the policy index
        self.listeners: list[Callable[[str | None], None]] = []
        self.lock = threading.Lock()


_registry = _Registry()


def on_change(listener: Callable[[str | None], None]) -> None:
    """Call `listener(None)` when a declaration is added or changed, `listener(using)` when rows were written."""
    if listener not in _registry.listeners:
        _registry.listeners.append(listener)


def _changed(using: str | None) -> None:
    for listener in list(_registry.listeners):
        listener(using)


def register_policy(policy: CodePolicy) -> CodePolicy:
    """Add or replace a declaration (a module imported again, a compat class with a new rate)."""
    if _registry.declared.get(policy.name) is policy:
        return policy  # the compat doors declare on every request: no lock for the usual case
    with _registry.lock:
        known = _registry.declared.get(policy.name)
        if known == policy:
            return known
        _registry.declared[policy.name] = policy
        _registry.written.discard(policy.name)
        _registry.pending = True
    _changed(None)  # the index enforces it from the next request on, with or without its row
    return policy


def view_path(view: Any) -> str:
    """The dotted path that names a view's declarations: a class-based view's class, or the function."""
    owner = getattr(view, "view_class", None) or getattr(view, "cls", None) or view  # View.as_view(): the class
    return f"{owner.__module__}.{owner.__qualname__}"


def declarations_of(view: str) -> list[CodePolicy]:
    """What the decorator declared on the view of dotted path `view` so far (still declared)."""
    return [policy for policy in _registry.by_view.get(view, ()) if _registry.declared.get(policy.name) is policy]


def declared_on(view: str, policy: CodePolicy) -> CodePolicy:
    """Remember that the decorator declared `policy` on `view` (so that another declaration there differs)."""
    _registry.by_view.setdefault(view, []).append(policy)
    return policy


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


def note_cost(action: str, cost: Any, declared: CodePolicy | None = None) -> None:
    """Remember a fixed cost a view's code gives `action` (for the checks and the admin's form); a
    cost above the capacity of the policy declared with it can never fit: ImproperlyConfigured."""
    if cost is None or callable(cost):
        return  # computed per request: a cost that never fits is answered then
    if declared is not None and cost > capacity(declared.values):
        raise ImproperlyConfigured(
            f"{declared.origin}: a request costs {cost} units, more than the policy allows at once "
            f"({capacity(declared.values)}): it could never be admitted."
        )
    known = _registry.costs.get(action)
    if known is None or known[0] < cost:
        _registry.costs[action] = (cost, declared.origin if declared else f"@ratelimit({action!r}, cost={cost})")


def code_costs() -> dict[str, tuple[int, str]]:
    """The fixed costs views' code gives actions: action -> (the largest, where it is declared)."""
    return dict(_registry.costs)


def add_provider(provider: Callable[[], list[CodePolicy]]) -> None:
    """Declarations that depend on settings (RATELIMIT_POLICIES, DRF's DEFAULT_THROTTLE_RATES), read at each sync."""
    if provider not in _registry.providers:
        _registry.providers.append(provider)


def declared_policies() -> list[CodePolicy]:
    """Everything declared in code: the views of the URLconf in use and decorators imported so far,
    compat classes, declare_policy()'s, and the providers'."""
    if _registry.routes_pending:
        _declare_routes()
    found = dict(_registry.declared)
    for provider in _registry.providers:
        for policy in provider():
            found.setdefault(policy.name, policy)
    return list(found.values())


def declared(name: str) -> CodePolicy | None:
    return next((policy for policy in declared_policies() if policy.name == name), None)


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
        raise ImproperlyConfigured(f"{origin}: each entry is a dict such as {{'name': 'api', 'action': '/api/', 'rate': '100/m'}}.")
    unknown = sorted(set(entry) - SETTING_KEYS)
    if unknown:
        raise ImproperlyConfigured(f"{origin}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(SETTING_KEYS))}.")
    if not entry.get("name") or not entry.get("action"):
        raise ImproperlyConfigured(f"{origin}: 'name' and 'action' are required.")
    fields = {k: v for k, v in entry.items() if k != "name"}
    # not kept in the registry: the setting is read again at every sync, so override_settings works
    return code_policy(entry["name"], origin=f"{origin} ({entry['name']})", **fields)


# --- writing declarations to the database ----------------------------------------------------


def sync(policies: Sequence[CodePolicy] | None = None, *, using: str = "default") -> int:
    """Create or update the rows of declared policies (all of them by default); returns how many rows
    were written.

    A row another worker wrote first is taken as it is (the insert skips it, nothing fails, nothing is
    logged) and updated only if this process's code declares other values. A database error is logged,
    not raised: the index enforces the declarations without their rows meanwhile.
    """
    policies = declared_policies() if policies is None else list(policies)
    try:
        written = _write(policies, using)
    except DatabaseError as error:
        logger.error("ratelimit: could not write the policies declared in code to the database: %s", error)
        with _registry.lock:
            _registry.pending = True  # tried again at the next load
        return 0
    with _registry.lock:
        _registry.written.update(p.name for p in policies if _registry.declared.get(p.name, p) is p)
    if written:
        _changed(using)  # this process reloads now, the others once committed
    return written


def _write(policies: list[CodePolicy], using: str) -> int:
    """Insert the missing rows, then update those whose code changed. Reads run outside any
    transaction: on SQLite a transaction that read first cannot wait for another writer's lock."""
    manager = Policy.objects.using(using)
    names = [policy.name for policy in policies]
    rows = {row.name: row for row in manager.filter(name__in=names)}
    missing = [policy for policy in policies if policy.name not in rows]
    if missing:
        with transaction.atomic(using=using):
            manager.bulk_create([_new_row(policy) for policy in missing], ignore_conflicts=True)
        rows.update((row.name, row) for row in manager.filter(name__in=[policy.name for policy in missing]))
    updated = sum(_update_row(policy, rows[policy.name], using) for policy in policies if policy.name in rows)
    return len(missing) + updated


def write_pending(using: str = "default") -> int:
    """Write the rows of declarations not written yet; a flag test when there are none. Called before
    the policy index loads, so that it reads them."""
    if not _registry.pending:
        return 0
    with _registry.lock:
        _registry.pending = False  # a declaration made during the write sets it again
        written = set(_registry.written)
    todo = [policy for policy in declared_policies() if policy.name not in written]
    return sync(todo, using=using) if todo else 0


def sync_pending(**kwargs: object) -> None:
    """At a request's start (a flag test after the first): at a process's first request, import the root
    URLconf so that its views declare their policies before the policy index first loads, and write the
    rows before the view runs (outside its transaction under ATOMIC_REQUESTS)."""
    if _registry.routes_pending:
        _declare_routes()
    write_pending()


def _declare_routes() -> None:
    """Import the URLconf in use and declare again what its views declared (forgotten by a reset)."""
    from django.urls import get_resolver

    _registry.routes_pending = False  # first: a view's module imported now reads the declarations
    try:
        views = list(_views(get_resolver().url_patterns))
    except Exception:  # noqa: BLE001 - the request's own resolve raises it again, where Django reports it
        logger.debug("ratelimit: the URLconf did not import before the first request", exc_info=True)
        return
    for view in views:
        for policy in list(_registry.by_view.get(view_path(view), ())):
            register_policy(policy)


def _views(patterns: Iterable[Any]) -> Iterator[Any]:
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):  # an include()
            yield from _views(pattern.url_patterns)
        else:
            yield pattern.callback


def forget_routes() -> None:
    """Another URLconf is in use: what its views declared is declared again before the next load."""
    _registry.routes_pending = True
    _changed(None)


def forget_declarations() -> None:
    """Forget what views declared (declared again when the URLconf in use routes to them) and which rows
    were written (written again): a test's declarations and a rolled-back database do not outlive it.
    Declarations not made on a view (compat classes, declare_policy()) and the settings' stay."""
    with _registry.lock:
        for made in _registry.by_view.values():
            for policy in made:
                if _registry.declared.get(policy.name) is policy:
                    del _registry.declared[policy.name]
        _registry.written.clear()
        _registry.pending = True
        _registry.routes_pending = True
    _changed(None)


def undeclare(name: str) -> None:
    """Forget one declaration (tests: a policy a test declared does not outlive it)."""
    with _registry.lock:
        _registry.declared.pop(name, None)
        _registry.written.discard(name)
    _changed(None)


def forget_synced() -> None:
    """Write every declaration again before the next load (the settings that providers read changed, or a
    test's database was rolled back)."""
    with _registry.lock:
        _registry.written.clear()
        _registry.pending = True
    _changed(None)


def not_written(policies: Iterable[CodePolicy]) -> None:
    """Declarations the index found no row for (a rolled-back transaction, a deleted row): written again
    before the next load."""
    with _registry.lock:
        _registry.written.difference_update(policy.name for policy in policies)
        _registry.pending = True


def unsaved_row(policy: CodePolicy) -> Policy:
    """The row a declaration stands for while it has none in the database. Its id is negative (never a
    row's) and the same in every process, so workers in that state still share their counters."""
    digest = blake2b(policy.name.encode(), digest_size=6).digest()
    return Policy(pk=-1 - int.from_bytes(digest, "big"), name=policy.name, source=Source.CODE, code_values=policy.values, **policy.values)


def _new_row(policy: CodePolicy) -> Policy:
    # a computed limit is marked: this process may declare it only at the first request it limits
    code_values = {**policy.values, COMPUTED: True} if policy.create_only else policy.values
    return Policy(name=policy.name, source=Source.CODE, code_values=code_values, description=policy.description, **policy.values)


def _update_row(policy: CodePolicy, row: Policy, using: str) -> bool:
    if policy.create_only and row.source == Source.CODE:
        return False
    if row.source != Source.CODE:
        logger.warning(
            "ratelimit: %s declares the policy %r, but a policy of that name was written in the admin; "
            "the admin's policy is kept. Rename one of them.", policy.origin, policy.name,
        )
        return False
    merged = _merge(row, policy.values)
    if merged == {field: getattr(row, field) for field in CODE_FIELDS} and row.code_values == policy.values:
        return False
    for field, value in merged.items():
        setattr(row, field, value)
    row.code_values = policy.values
    try:
        row.full_clean(exclude=["source"], validate_unique=False, validate_constraints=False)
    except ValidationError as error:
        logger.error("ratelimit: the code's values for policy %r do not fit the admin's changes (%s); kept as it was.", policy.name, _messages(error))
        return False
    with transaction.atomic(using=using):
        Policy.objects.using(using).filter(pk=row.pk).update(code_values=policy.values, updated=timezone.now(), **merged)
    return True


def _merge(row: Policy, declared: dict[str, Any]) -> dict[str, Any]:
    """The row's values after a deploy: the code's, except what the operator changed since the last one."""
    before = row.code_values or {}
    merged = {field: declared[field] for field in CODE_FIELDS}
    if any(getattr(row, field) != before.get(field) for field in RATE_FIELDS):
        merged.update({field: getattr(row, field) for field in RATE_FIELDS})
    for field in ("mode", "enabled"):
        if getattr(row, field) != before.get(field):
            merged[field] = getattr(row, field)
    return merged


# --- what the admin shows ----------------------------------------------------------------------


def changed_fields(row: Policy) -> list[str]:
    """The fields an operator changed away from the code's values (empty for an admin policy)."""
    if row.source != Source.CODE or not row.code_values:
        return []
    return [field for field in OPERATOR_FIELDS if getattr(row, field) != row.code_values.get(field)]


def declared_names() -> set[str]:
    return {policy.name for policy in declared_policies()}


def no_longer_in_code(row: Policy, names: set[str] | None = None) -> bool:
    """A code policy that nothing loaded in this process declares any more (kept and enforced as it is).

    Unknown (False) for a limit computed per request, declared only when a request first meets it.
    """
    if row.source != Source.CODE or (row.code_values or {}).get(COMPUTED):
        return False
    return row.name not in (declared_names() if names is None else names)


def revert(row: Policy) -> list[str]:
    """Put the code's values back (the row is saved); returns the fields that changed."""
    changed = changed_fields(row)
    for field in changed:
        setattr(row, field, row.code_values[field])
    if changed:
        row.save()
    return changed


@receiver(post_migrate, dispatch_uid="ratelimit_registry_sync")
def _after_migrate(sender, using: str = "default", **kwargs: object) -> None:
    if getattr(sender, "label", None) == "ratelimit_app":
        sync(using=using)


@register()
def check_declared_policies(app_configs: object = None, **kwargs: object) -> list:
    """Bad RATELIMIT_POLICIES entries are reported by `manage.py check` (they are skipped at run time)."""
    errors: list[str] = []
    settings_policies(errors)
    return [
        Error(message, hint="Fix the entry in your settings. Where checks do not run (e.g. under gunicorn) it is skipped, with a logged error.", id="ratelimit_app.E010")
        for message in errors
    ]


add_provider(settings_policies)
