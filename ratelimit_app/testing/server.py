"""The Redis-compatible server a test session uses: the one named (RATELIMIT_TEST_REDIS_URL, REDIS_URL) or
an embedded server started for it; the app's cache pointed at it; counters and state reset around each
test. Used by the pytest plugin and by RatelimitTestRunnerMixin."""

from __future__ import annotations

import atexit
import os

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django.conf import settings
from django.core.cache import caches

from .. import engine, registry, runtime
from ..conf import get_setting
from ..embedded import TEST_SERVER_VARIABLE, PrivateRedis

# The alias added when RATELIMIT_CACHE names no django-redis cache (e.g. the default LocMemCache).
ADDED_ALIAS = "ratelimit_testing"
# Options tied to the server the settings name, which the embedded server (no password, no TLS, one
# node) would refuse.
SERVER_OPTIONS = {"CONNECTION_FACTORY", "SENTINELS", "SENTINEL_KWARGS", "PASSWORD", "USERNAME"}
PLAIN_CLIENT = "django_redis.client.DefaultClient"


def added_options() -> dict:
    """The added cache's options: timeouts and one retry of a broken connection, as the quick start's, so
    that `manage.py check` has nothing to say about it; 1 s rather than 0.25 s for a busy CI machine."""
    return {"SOCKET_CONNECT_TIMEOUT": 1.0, "SOCKET_TIMEOUT": 1.0,
            "CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))}}


def ratelimit_installed() -> bool:
    return any(app == "ratelimit_app" or app.startswith("ratelimit_app.") for app in settings.INSTALLED_APPS)


class TestRedis:
    """The server of one test process (one per pytest-xdist worker), and what pointing the cache at it changed."""

    def __init__(self, url: str, origin: str, server: PrivateRedis | None = None, shared: bool = False) -> None:
        self.url = url
        self.origin = origin  # said in pytest's header: which server the tests use
        self.server = server
        self.shared = shared  # other processes count on this server too: each keeps its own key prefix
        self.alias = ""
        self.worker = ""
        self.declared: dict = {}  # what was declared in code before the test running

    @classmethod
    def begin(cls, url: str | None = None, shared: bool = False) -> TestRedis:
        """Use the server at `url`, else RATELIMIT_TEST_REDIS_URL's, else REDIS_URL's, else start one."""
        for source, named in (("given", url), (TEST_SERVER_VARIABLE, os.environ.get(TEST_SERVER_VARIABLE)),
                              ("REDIS_URL", os.environ.get("REDIS_URL"))):
            if named:
                session = cls(named, f"{source}, not started by ratelimit_app", shared=True)
                break
        else:
            server = PrivateRedis()
            try:
                server.start()
            except OSError as error:  # RATELIMIT_REDIS_SERVER names no program that runs
                server.stop()
                raise RuntimeError(f"Could not start the Redis-compatible server {server.binary} ({server.origin}): "
                                   f"{error}") from None
            atexit.register(server.stop)  # a session that ends without its teardown (Ctrl-C) stops it too
            session = cls(server.url, f"{server.binary}, {server.origin}", server=server, shared=shared)
        session.point_cache()
        return session

    def point_cache(self) -> None:
        """RATELIMIT_CACHE's alias (a cache the app adds when it names none of django-redis) at the server."""
        alias = get_setting("RATELIMIT_CACHE")
        entry = settings.CACHES.get(alias)
        if entry is None or not str(entry.get("BACKEND", "")).startswith("django_redis."):
            alias = ADDED_ALIAS
            settings.CACHES[alias] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": self.url,
                                      "OPTIONS": added_options()}
            settings.RATELIMIT_CACHE = alias
        elif entry.get("LOCATION") != self.url:
            options = dict(entry.get("OPTIONS", {}))
            if self.server is not None:  # the settings' credentials and topology are not the embedded server's
                options = {name: value for name, value in options.items() if name not in SERVER_OPTIONS}
                if options.get("CLIENT_CLASS", PLAIN_CLIENT) != PLAIN_CLIENT:  # a Sentinel or sharded client
                    del options["CLIENT_CLASS"]
            settings.CACHES[alias] = {**entry, "LOCATION": self.url, "OPTIONS": options}
        self.alias = alias
        self._forget_cache()

    def _forget_cache(self) -> None:
        try:
            del caches[self.alias]  # a cache made before (a system check) keeps the old server
        except AttributeError:
            pass
        runtime.state.reset()  # settings read and Redis clients made before go with it

    def enter_worker(self, worker: str) -> None:
        """This process is one of several sharing the server: its counters get a prefix of their own, so
        that another worker's reset never empties them."""
        if self.worker == worker or not self.shared:
            return
        base = getattr(settings, "RATELIMIT_KEY_PREFIX", None) or "rl"
        if self.worker:
            base = base.removesuffix(f"-{self.worker}")
        settings.RATELIMIT_KEY_PREFIX = f"{base}-{worker}"
        self.worker = worker
        runtime.state.reset()

    def before_test(self) -> None:
        """A test starts with no counter under the key prefix and a process that remembers nothing."""
        runtime.state.reset()  # first: it waits for counts still being sent, which would land after the deletion
        self.declared = registry.declarations()  # what the test declares in code goes with it
        # reset_counters() without its notice to other processes, which needs the database (a test may have none)
        client = engine.client()
        names = list(client.scan_iter(match=f"{engine.key_prefix()}:*", count=1000))
        if names:
            client.delete(*names)

    def after_test(self) -> None:
        registry.restore_declarations(self.declared)
        runtime.state.reset()

    def end(self) -> None:
        if self.server is not None:
            self.server.stop()
