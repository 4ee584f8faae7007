"""The one place that reacts to a changed setting (override_settings in tests, a settings reload):
each part of the app forgets what it derived from the settings it reads, the settings cache first."""

from __future__ import annotations

from typing import Callable

from django.core.signals import setting_changed
from django.dispatch import receiver

from . import admin_connection, conf, connection, decision_connection, doors, metrics, policies, registry, subjects
from .breaker import breaker
from .deny_cache import deny_cache

CACHE_SETTINGS = {"CACHES", "RATELIMIT_CACHE", "RATELIMIT_USE_CACHE", "RATELIMIT_ADMIN_TIMEOUT"}

# (settings, what forgets them); None: every setting. In order: the settings cache comes first.
FORGET: tuple[tuple[set[str] | None, Callable[[], None]], ...] = (
    (None, conf.forget_settings),
    (CACHE_SETTINGS, connection.forget_clients),
    (CACHE_SETTINGS, decision_connection.unpin),
    (CACHE_SETTINGS, deny_cache.clear),  # another server's refusals, or a server another cache emptied
    ({"RATELIMIT_USE_CACHE"}, breaker.reset),  # django-ratelimit's tests switch caches around an open circuit
    (CACHE_SETTINGS, admin_connection.forget_client),
    (None, subjects.forget_settings),  # several settings shape subjects: cheap to forget
    ({"RATELIMIT_METRICS"}, metrics.forget_settings),
    ({"RATELIMIT_POLICY_RECHECK_SECONDS", "RATELIMIT_POLICY_RELOAD_SECONDS"}, policies.forget_settings),
    ({"RATELIMIT_POLICIES", "REST_FRAMEWORK"}, registry.forget_synced),  # what the declarations' providers read
    ({"ROOT_URLCONF"}, doors.forget_routes),
)


@receiver(setting_changed, dispatch_uid="ratelimit_settings_changed")
def settings_changed(setting: str, **kwargs: object) -> None:
    for names, forget in FORGET:
        if names is None or setting in names:
            forget()
