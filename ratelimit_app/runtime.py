"""What ratelimit_app keeps in a process, in one place: `state` lists every part with how it forgets
itself (state.reset(), used by ratelimit_app.testing.reset()), and a changed setting (override_settings
in tests, a settings reload) makes the parts that read it forget what they derived, the settings cache first."""

from __future__ import annotations

from typing import Callable

from django.core.signals import setting_changed
from django.dispatch import receiver

from . import boundary, closing, conf, doors, events, lru, metrics, policies, registry, subjects
from .deny_cache import deny_cache
from . import engine
from .engine import breaker, forget_aclients, forget_admin_client, forget_clients, owed, unpin
from .events import outage
from .quotas import saver, unreadable_said

CACHE_SETTINGS = {"CACHES", "RATELIMIT_CACHE", "RATELIMIT_USE_CACHE", "RATELIMIT_ADMIN_TIMEOUT"}

# (settings, what forgets them); None: every setting. In order: the settings cache comes first.
FORGET: tuple[tuple[set[str] | None, Callable[[], None]], ...] = (
    (None, conf.forget_settings),
    ({"RATELIMIT_CACHE_BYTES"}, lru.forget_settings),  # each cache takes its share of the new total
    (CACHE_SETTINGS, forget_clients),
    (CACHE_SETTINGS, forget_aclients),
    (CACHE_SETTINGS, unpin),
    (CACHE_SETTINGS, deny_cache.clear),  # another server's refusals, or a server another cache emptied
    ({"RATELIMIT_USE_CACHE"}, breaker.reset),  # django-ratelimit's tests switch caches around an open circuit
    (CACHE_SETTINGS, forget_admin_client),
    (CACHE_SETTINGS, engine.server_clock.forget),  # another server's clock
    (None, subjects.forget_settings),  # several settings shape subjects: cheap to forget
    (None, doors.forget_checks),  # the subjects the middleware keeps per route and address, with them
    ({"RATELIMIT_METRICS"}, metrics.forget_settings),
    ({"RATELIMIT_POLICY_RECHECK_SECONDS", "RATELIMIT_POLICY_RELOAD_SECONDS"}, policies.forget_settings),
    ({"RATELIMIT_POLICIES", "REST_FRAMEWORK"}, registry.forget_synced),  # what the declarations' providers read
    ({"ROOT_URLCONF"}, doors.forget_routes),
    ({"ROOT_URLCONF"}, registry.forget_routes),  # the views' declarations of the new URLconf are made again
)


class AppState:
    """Every singleton ratelimit_app keeps in a process, each by what forgets it: one list, so that
    nothing is left out of a reset. Redis and the database are not part of it."""

    def __init__(self, parts: tuple[tuple[str, Callable[[], None]], ...]) -> None:
        self.parts = parts

    def reset(self) -> None:
        """Forget everything, as if the process had just started (in the order of `parts`)."""
        for _name, forget in self.parts:
            forget()


state = AppState((
    ("settings read", conf.forget_settings),  # first: what follows reads the settings again
    ("Redis client per cache settings", forget_clients),
    ("asyncio Redis clients per loop", forget_aclients),
    ("threads' kept decision connections", unpin),
    ("the admin's Redis client", forget_admin_client),
    ("Redis's clock as this worker tells it", engine.server_clock.forget),
    ("subjects: trusted proxies, grouped addresses, displays", subjects.forget_settings),
    ("subjects: the warning about a request without an address", subjects.forget_warning),
    ("metrics switched on or off", metrics.forget_settings),
    ("policy index (loaded again at the next request)", policies.forget_index),
    ("policy index's recheck and reload deadlines", policies.forget_settings),
    ("code declarations of views, written rows, URLconf read", registry.forget_declarations),
    ("resolved routes", doors.forget_routes),
    ("every cache bounded in bytes (script arguments, packed commands, subjects ...)", lru.clear),
    ("policies and checks kept per route", doors.forget_checks),
    ("deny cache", deny_cache.clear),
    ("circuit breaker", breaker.reset),
    ("outage log's last line", outage.reset),
    ("the limiter's faults: counts, last errors, what the log said", boundary.faults.reset),
    ("what the log said of declarations whose rows cannot be written", registry.unwritten_said.reset),
    ("what the log said of saved quota usage that cannot be read", unreadable_said.reset),
    ("what the log said of signal receivers that failed", events.receiver_failed_said.reset),
    ("what the log said of settles ignored", closing.ignored_said.reset),
    ("Redis availability (lost/found signals)", events.availability.reset),
    ("in-flight places owed back to Redis", owed.forget),
    ("quota usage not saved yet (what is saved stays)", saver.discard),
    # last: waits for a flush under way, so that what it sends lands before a caller empties Redis
    ("counts not yet added to the policies' totals", engine.tally.discard),
))


@receiver(setting_changed, dispatch_uid="ratelimit_settings_changed")
def settings_changed(setting: str, **kwargs: object) -> None:
    for names, forget in FORGET:
        if names is None or setting in names:
            forget()
