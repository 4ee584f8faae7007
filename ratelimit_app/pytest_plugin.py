"""The pytest plugin of `pip install "ratelimit-app[testing]"` (entry point `pytest11`, name `ratelimit_app`):
a Redis-compatible server per test session (per pytest-xdist worker), RATELIMIT_CACHE's alias pointed at it,
counters and the app's state reset around each test. `-p no:ratelimit_app` switches it off."""

from __future__ import annotations


import pytest

# Imported when Django is set up (pytest-django does it before this plugin's pytest_configure), not with
# the plugin, which pytest loads first of all.
_session = None
_tried = False


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ratelimit_app")
    group.addoption("--ratelimit-redis", dest="ratelimit_redis", default=None, metavar="URL",
                    help="a running Redis-compatible server for the tests, instead of the one the plugin starts")
    parser.addini("ratelimit_redis", "URL of a running Redis-compatible server for the tests (as --ratelimit-redis)")


def _is_xdist_controller(config: pytest.Config) -> bool:
    """pytest-xdist's controller runs no test: its workers start a server each."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None)) \
        and getattr(config.option, "dist", "no") != "no"


def _django_ready() -> bool:
    from django.apps import apps
    from django.conf import settings

    return settings.configured and apps.ready


def _begin(config: pytest.Config):
    """The session's server, started the first time Django is ready and lists ratelimit_app; None otherwise."""
    global _session, _tried
    if _tried or _is_xdist_controller(config) or not _django_ready():
        return _session
    _tried = True
    from ratelimit_app.testing.server import TestRedis, ratelimit_installed

    if not ratelimit_installed():
        return None
    url = config.getoption("ratelimit_redis") or config.getini("ratelimit_redis") or None
    try:
        _session = TestRedis.begin(url)
    except RuntimeError as error:  # no server binary: say what to install, without a traceback
        raise pytest.UsageError(f"ratelimit_app: {error}") from None
    # this process's own worker id, not PYTEST_XDIST_WORKER: a pytest run a test starts inherits that variable
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        _session.enter_worker(worker)
    return _session


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    _begin(config)


def pytest_report_header(config: pytest.Config) -> str | None:
    if _session is not None:
        return f"ratelimit_app: Redis-compatible server {_session.url} ({_session.origin})"
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    global _session, _tried
    if _session is not None:
        _session.end()
    _session, _tried = None, False


@pytest.fixture(autouse=True)
def _ratelimit_isolation(request: pytest.FixtureRequest):
    """Each test starts with no counter and a process that remembers nothing of the test before."""
    session = _begin(request.config)
    if session is not None:
        session.before_test()
    yield
    if session is not None:
        session.after_test()


@pytest.fixture
def ratelimit_server(request: pytest.FixtureRequest):
    """The server the tests use: `.url`, `.origin` (which binary, or who named it), `.alias` (the cache)."""
    session = _begin(request.config)
    if session is None:
        pytest.skip("ratelimit_app is not in INSTALLED_APPS, or Django is not set up")
    return session
