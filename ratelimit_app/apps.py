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
        from .boundary import MIDDLEWARE, protected

        # declarations of settings and code are written at a process's first request, never while its index
        # loads; inside the boundary, as a signal's receiver that raises fails the request before any view
        sync_pending = protected(registry.sync_pending, MIDDLEWARE, lambda _error: None)
        request_started.connect(sync_pending, dispatch_uid="ratelimit_registry_pending", weak=False)
        # places no door gives back (hit() without the middleware) go back when the request ends (and
        # when Django closes the request: limiter.asking)
        request_started.connect(doors.request_began, dispatch_uid="ratelimit_request_began")
        request_finished.connect(doors.request_ended, dispatch_uid="ratelimit_request_ended")
