from __future__ import annotations

from django.apps import AppConfig


class RateLimitConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = "Rate limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import request_started

        # system checks, settings, invalidation, code policies
        from . import checks, doors, registry, runtime, signals  # noqa: F401

        # declarations of settings and code are written at a process's first request, never while its index loads
        request_started.connect(registry.sync_pending, dispatch_uid="ratelimit_registry_pending")
