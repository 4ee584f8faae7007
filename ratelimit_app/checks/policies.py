"""System checks of the policies: rows that cannot be enforced, and per-user policies that
RateLimitMiddleware placed before AuthenticationMiddleware would never apply."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register
from django.core.exceptions import ValidationError
from django.db import DatabaseError
from django.utils.module_loading import import_string

from ..models import Policy


@register(deploy=False)
def check_policies(app_configs: object = None, **kwargs: object) -> list:
    from ..loading import compile_policy

    warnings = []
    try:
        rows = list(Policy.objects.all())
    except DatabaseError:
        return []  # not migrated yet: nothing to check
    for row in rows:
        try:
            compile_policy(row)
        except (ValidationError, ValueError, KeyError) as error:
            warnings.append(
                Warning(
                    f"Policy {row.name!r} (id {row.pk}) is invalid and is ignored: {error}",
                    hint="Fix it in the admin; requests are not limited by it meanwhile.",
                    obj=row,
                    id="ratelimit_app.W001",
                )
            )
    return warnings


@register(deploy=False)
def check_subject_rows(app_configs: object = None, **kwargs: object) -> list:
    """Overrides, plan assignments and plan limits that reached the database without validation."""
    from ..loading import invalid_rows

    try:
        found = invalid_rows()
    except DatabaseError:
        return []  # not migrated yet: nothing to check
    return [
        Warning(
            f"The {described} is invalid and is ignored: "
            + "; ".join(f"{field}: {' '.join(messages)}" for field, messages in error.message_dict.items()),
            hint="Fix it in the admin (the policy's or the plan's page); the requests it would match get the "
            "limit they would have without it meanwhile.",
            id="ratelimit_app.W007",
        )
        for described, error in found
    ]


RATELIMIT_MIDDLEWARE = "ratelimit_app.middleware.RateLimitMiddleware"
AUTHENTICATION_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


@register()
def check_middleware_order(app_configs: object = None, **kwargs: object) -> list:
    """Policies counted per user need request.user, which AuthenticationMiddleware sets: before it (or
    without it) they silently never apply, and user_or_ip counts every user by address."""
    limiter_at = _position(RATELIMIT_MIDDLEWARE)
    if limiter_at is None:
        return []
    authentication_at = _position(AUTHENTICATION_MIDDLEWARE)
    if authentication_at is not None and authentication_at < limiter_at:
        return []
    counting_users = _policies_counting_users()
    if not counting_users:
        return []
    where = "is not in MIDDLEWARE" if authentication_at is None else "comes after RateLimitMiddleware"
    return [
        Warning(
            f"AuthenticationMiddleware {where}, so RateLimitMiddleware never sees who is logged in: policies "
            f"counted per user ({', '.join(counting_users)}) do not apply, and 'user_or_ip' counts every "
            "user by address.",
            hint=f"Put '{RATELIMIT_MIDDLEWARE}' right after '{AUTHENTICATION_MIDDLEWARE}' in MIDDLEWARE.",
            id="ratelimit_app.W004",
        )
    ]


def _position(middleware: str) -> int | None:
    """Where `middleware` (or a subclass of it) stands in MIDDLEWARE, or None."""
    wanted = import_string(middleware)
    for position, path in enumerate(settings.MIDDLEWARE):
        try:
            candidate = import_string(path)
        except ImportError:
            continue  # Django reports an unimportable middleware itself when it loads it
        if isinstance(candidate, type) and issubclass(candidate, wanted):
            return position
    return None


def _policies_counting_users() -> list[str]:
    from ..loading import compile_policy

    try:
        rows = list(Policy.objects.filter(enabled=True).order_by("name"))
    except DatabaseError:
        return []  # not migrated yet: no policies
    names = []
    for row in rows:
        try:
            if compile_policy(row).counts_users:
                names.append(row.name)
        except (ValidationError, ValueError, KeyError):
            continue  # an invalid policy is reported by ratelimit_app.W001
    return names
