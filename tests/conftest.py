"""A real Redis for the whole session (REDIS_URL, or a private server started here), emptied per test.

Under pytest-xdist (`make test`: -n 4) each worker is a session of its own: its own private server, its own
test database (pytest-django names it per worker), its own temporary directories."""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import time
from pathlib import Path

import pytest
from django.conf import settings
from django_redis import get_redis_connection
from django_redis.pool import ConnectionFactory

from project.devredis import PrivateRedis, find_server
from ratelimit_app import registry, testing
from ratelimit_app.connection import ClusterConnectionFactory

_private: PrivateRedis | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Point the cache at the server before anything connects (settings were read already).

    Each pytest-xdist worker starts a private server of its own, even under REDIS_URL: tests flush it, load
    and flush its functions, change its configuration and kill its clients, so two workers must never share
    one. A run in one process (-n 0) uses REDIS_URL when it is set. Subprocesses inherit the worker's."""
    global _private
    if _controller(config):
        return  # xdist's controller only hands tests to the workers
    if hasattr(config, "workerinput") or not os.environ.get("REDIS_URL"):
        _private = PrivateRedis().start()
        os.environ["REDIS_URL"] = _private.url  # for subprocesses the tests start
    settings.CACHES["default"]["LOCATION"] = os.environ["REDIS_URL"]
    # users made by tests log in without a million rounds of PBKDF2 each (servers the tests start keep the default)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_report_header(config: pytest.Config) -> str:
    if _controller(config):
        return "redis: a private server for each worker: {} ({})".format(*find_server())
    if _private:
        return f"redis: a private server at {_private.url}: {_private.binary} ({_private.origin})"
    return f"redis: {os.environ['REDIS_URL']} (REDIS_URL)"


def _controller(config: pytest.Config) -> bool:
    """Whether this process is xdist's controller, which runs no test itself (-n N with N > 0)."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "tx", None))


# Seconds each test took (setup and teardown included) in a run of the whole suite, for the order in which
# the workers get them: `pytest -n 4 --store-durations` writes it again. A test not in it counts as quick.
DURATIONS = Path(__file__).with_name("durations.json")
QUICK = 0.2


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test's seconds to {DURATIONS.name}, for the order -n N hands the tests out")
    parser.addoption("--cpu-durations", type=int, metavar="N", default=None,
                     help="print the N tests and modules that took the most CPU seconds (the test's process "
                          "and the subprocesses it waited for): wall clock says little on a busy machine")


@pytest.hookimpl(optionalhook=True)  # -p no:xdist: no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """-n N: tests go one by one to whichever worker is free, except that the tests of a module that defines
    a fixture of module or class scope (a built package, a cluster, a migrated site) all go to one worker,
    so that it is made once. The longest go first (DURATIONS): the run ends when its last test does, and a
    long one handed out last would run alone at the end."""
    if config.getoption("dist") != "load":
        return None  # --dist loadfile, loadscope...: as asked
    from xdist.scheduler import LoadScopeScheduling

    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}

    class LongestFirst(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if _shares_fixtures(config.rootpath / module) else nodeid

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete before the first unit is handed out
                units = sorted(self.workqueue.items(),
                               key=lambda unit: -sum(seconds.get(test, QUICK) for test in unit[1]))
                self.workqueue.clear()
                self.workqueue.update(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


_took: dict[str, float] = {}
_cpu: dict[str, float] = {}


def _cpu_seconds() -> float:
    return sum(usage.ru_utime + usage.ru_stime
               for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """--cpu-durations: each phase's report carries its CPU seconds (to xdist's controller too)."""
    outcome = yield
    if item.config.getoption("cpu_durations") is not None:
        now = _cpu_seconds()
        start = item.stash.get(_CPU_START, None)
        if start is not None:
            outcome.get_result().user_properties.append(("cpu_seconds", now - start))
        item.stash[_CPU_START] = now


_CPU_START = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.config.getoption("cpu_durations") is not None:
        item.stash[_CPU_START] = _cpu_seconds()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration
    for name, seconds in report.user_properties:
        if name == "cpu_seconds":
            _cpu[report.nodeid] = _cpu.get(report.nodeid, 0.0) + seconds


def pytest_sessionfinish(session: pytest.Session) -> None:
    """--store-durations: the tests that ran replace their seconds (a part of the suite leaves the rest)."""
    if session.config.getoption("store_durations") and not hasattr(session.config, "workerinput"):
        seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        seconds.update((test, round(took, 1)) for test, took in _took.items())
        long_enough = {test: took for test, took in sorted(seconds.items()) if took >= 2 * QUICK}
        DURATIONS.write_text(json.dumps(long_enough, indent=0) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """-n N: the tests marked slow first, in their random order, so that none is left running alone at the end."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@functools.cache
def _shares_fixtures(module: Path) -> bool:
    """Whether a test module defines a fixture that several of its tests share (read, not imported: xdist's
    controller collects nothing)."""
    return module.suffix == ".py" and bool(SHARED_FIXTURE.search(module.read_text()))


SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope=["'](class|module|package)["']""")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """--cpu-durations; then the order the tests ran in, printed last (even with -q): a failure that depends
    on it replays."""
    count = config.getoption("cpu_durations")
    if count is not None and _cpu:
        modules: dict[str, float] = {}
        for test, seconds in _cpu.items():
            modules[test.split("::", 1)[0]] = modules.get(test.split("::", 1)[0], 0.0) + seconds
        terminalreporter.write_sep("=", f"CPU seconds: {sum(_cpu.values()):.1f} in all")
        for title, found in (("tests", _cpu), ("modules", modules)):
            for name, seconds in sorted(found.items(), key=lambda pair: -pair[1])[:count or None]:
                terminalreporter.write_line(f"{seconds:8.1f}s cpu  {name}")
            terminalreporter.write_line(f"({title})")
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed")
        terminalreporter.write_line(f"Tests ran in random order: --randomly-seed={seed} replays it (-p no:randomly: file order).")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _private:
        _private.stop()


@pytest.fixture
def redis_client():
    return get_redis_connection("default")


@pytest.fixture(autouse=True)
def away_from_a_minute_boundary():
    """Most tests count in 60 s fixed windows on the server's clock: one that starts in a window's last
    second waits for the next, or its counts would start over mid-test (window edges have tests of their own)."""
    left = 60 - time.time() % 60
    if left < 1:
        time.sleep(left + 0.05)


@pytest.fixture(autouse=True)
def empty_redis(redis_client):
    """Every test starts from an empty Redis and a process that remembers nothing of the test before
    (index, refusals, circuit, logs, clients, the policies it declared in code, code policies written to a
    rolled-back database)."""
    testing.reset()  # waits for a flush of the totals under way: nothing of it lands after the FLUSHDB
    redis_client.flushdb()
    pools_before, clusters_before = set(ConnectionFactory._pools), set(ClusterConnectionFactory._clusters)
    declared_before = registry.declarations()
    yield
    registry.restore_declarations(declared_before)  # a compat class or declare_policy() of the test goes with it
    testing.reset()
    # django-redis keeps a pool per LOCATION for the whole process, options and credentials included (and
    # the cluster factory a client): a later test whose server got the same free port would reuse one made
    # for another server, e.g. logging in as an ACL user it lacks. What a test made goes with it.
    for url in set(ConnectionFactory._pools) - pools_before:
        ConnectionFactory._pools.pop(url).disconnect()
    for url in set(ClusterConnectionFactory._clusters) - clusters_before:
        ClusterConnectionFactory._clusters.pop(url).disconnect_connection_pools()


@pytest.fixture
def private():
    """A Redis server of the test's own, started and stopped with it (the app does not use it unless told)."""
    server = PrivateRedis().start()
    yield server
    server.stop()


@pytest.fixture
def server(settings, private):
    """A Redis of the test's own that the app uses, which the test may pause, stop and start again."""
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": private.url}}
    settings.RATELIMIT_CACHE = "own"
    return private


@pytest.fixture
def outage_forgotten():
    """The outage a test causes is not the one the next test's log should be quiet about."""
    yield
    testing.reset()
