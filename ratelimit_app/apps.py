from __future__ import annotations

from django.apps import AppConfig


class RateLimitConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = "Rate limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import request_finished, request_started

        # system checks, settings, invalidation, code policies
        from . import checks, closing, registry, runtime, signals  # noqa: F401
        from .boundary import MIDDLEWARE, protected

        # declarations of settings and code are written at a process's first request, never while its index
        # loads; inside the boundary, as a signal's receiver that raises fails the request before any view
        sync_pending = protected(registry.sync_pending, MIDDLEWARE, lambda _error: None)
        request_started.connect(sync_pending, dispatch_uid="ratelimit_registry_pending", weak=False)
        # a request's closing step (closing.py) also runs when it ends: what no door sent (hit() without
        # the middleware, a streamed answer dropped unsent) goes then
        request_started.connect(closing.request_began, dispatch_uid="ratelimit_request_began")
        request_finished.connect(closing.request_ended, dispatch_uid="ratelimit_request_ended")
