"""`manage.py test` with a Redis-compatible server of its own: `--testrunner ratelimit_app.testing.RatelimitTestRunner`
(or TEST_RUNNER), or RatelimitTestRunnerMixin before your own runner's base."""

from __future__ import annotations

import os
import unittest

from django.test import runner as django_runner
from django.test.runner import DiscoverRunner, ParallelTestSuite, RemoteTestResult, RemoteTestRunner

from ..embedded import TEST_SERVER_VARIABLE, use_parent_server
from .server import TestRedis, ratelimit_installed

_session: TestRedis | None = None  # the server of this process's tests, for the result classes


def _worker() -> str:
    # Django numbers its --parallel workers from 1; the main process is 0
    worker = getattr(django_runner, "_worker_id", 0)
    return f"w{worker}" if worker else ""


class ResettingResult:
    """Resets counters and the app's state around each test (a result's startTest and stopTest
    frame each test, whatever the runner)."""

    replayed = False  # set on the main process's result when workers ran the tests: it only replays them

    def startTest(self, test) -> None:
        global _session
        if _session is None and _worker() and os.environ.get(TEST_SERVER_VARIABLE) and ratelimit_installed():
            _session = TestRedis.begin()  # a spawned worker: the parent's server, named by use_parent_server()
        if _session is not None and not self.replayed:
            if _worker():
                _session.enter_worker(_worker())
            _session.before_test()
        super().startTest(test)

    def stopTest(self, test) -> None:
        super().stopTest(test)
        if _session is not None and not self.replayed:
            _session.after_test()


class _RemoteResult(ResettingResult, RemoteTestResult):
    pass


class _RemoteRunner(RemoteTestRunner):
    resultclass = _RemoteResult


class RatelimitParallelTestSuite(ParallelTestSuite):
    """Django's parallel suite whose workers reset around each test, on the parent's server."""

    runner_class = _RemoteRunner

    process_setup = use_parent_server  # called in spawned workers only

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if _session is not None:
            self.process_setup_args = (_session.url,)

    def run(self, result):
        result.replayed = True
        return super().run(result)


class RatelimitTestRunnerMixin:
    """Starts one Redis-compatible server for the run (or uses RATELIMIT_TEST_REDIS_URL's or REDIS_URL's),
    points RATELIMIT_CACHE's alias at it, and resets counters and the app's state around each test;
    --parallel workers share the server, each under a key prefix of its own."""

    parallel_test_suite = RatelimitParallelTestSuite

    def setup_test_environment(self, **kwargs) -> None:
        global _session
        super().setup_test_environment(**kwargs)
        if ratelimit_installed():
            _session = TestRedis.begin(shared=getattr(self, "parallel", 1) > 1)
            if self.verbosity >= 2:
                print(f"ratelimit_app: tests use {_session.url} ({_session.origin})")

    def teardown_test_environment(self, **kwargs) -> None:
        global _session
        super().teardown_test_environment(**kwargs)
        if _session is not None:
            _session.end()
            _session = None

    def get_resultclass(self):
        base = super().get_resultclass() or unittest.TextTestResult
        return type(f"Ratelimit{base.__name__}", (ResettingResult, base), {})


class RatelimitTestRunner(RatelimitTestRunnerMixin, DiscoverRunner):
    """Django's DiscoverRunner with a Redis-compatible server for the tests (RatelimitTestRunnerMixin)."""
