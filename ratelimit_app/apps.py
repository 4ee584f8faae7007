from __future__ import annotations

from django.apps import AppConfig


class RateLimitConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = "Rate limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import request_finished, request_started

        # system checks, settings, invalidation, code policies
        from . import checks, doors, registry, runtime, signals  # noqa: F401

        # declarations of settings and code are written at a process's first request, never while its index loads
        request_started.connect(registry.sync_pending, dispatch_uid="ratelimit_registry_pending")
        # places no door gives back (hit() without the middleware) go back when the request ends (and
        # when Django closes the request: limiter.asking)
        request_started.connect(doors.request_began, dispatch_uid="ratelimit_request_began")
        request_finished.connect(doors.request_ended, dispatch_uid="ratelimit_request_ended")
