from __future__ import annotations

from django.apps import AppConfig


class RateLimitConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = "Rate limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, registry, signals  # noqa: F401  (system checks, invalidation, code policies after migrate)
