"""The pytest plugin and the test runner of `ratelimit-app[testing]`, run by pytester on a tiny project
whose settings point the app's cache at a port nothing listens on: the tests pass only against the
server the plugin starts, and a test that reached a limit leaves the next one unlimited."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from ratelimit_app.embedded import free_port
from tests.servers import ROOT

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # each test runs pytest or manage.py test in a process of its own

SETTINGS = '''
SECRET_KEY = "tiny"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "tinysite.urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "ratelimit_app"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratelimit_app.middleware.RateLimitMiddleware",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "tiny.sqlite3"}}
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # a server nobody started: the tests reach the plugin's
    "ratelimit": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:%(port)d/0",
                  "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}},
}
RATELIMIT_CACHE = "ratelimit"
RATELIMIT_FAIL_OPEN = False  # a request that cannot reach Redis is answered 503, not let through
USE_TZ = True
'''

URLS = '''
from django.http import HttpResponse
from django.urls import path

from ratelimit_app.decorators import ratelimit


@ratelimit(rate="2/m", key="ip", name="login")
def login(request):
    return HttpResponse("welcome")


@ratelimit(rate="2/m", key="ip", name="search")
async def search(request):
    return HttpResponse("found")


urlpatterns = [path("login/", login), path("search/", search)]
'''

# Each test reaches the limit: run in any order, each starts from full counters or fails.
TESTS = '''
import pytest
from django.test import TestCase, TransactionTestCase

from ratelimit_app.testing import assert_charged


def three(client, url="/login/"):
    return [client.get(url) for _ in range(3)]


class TestWithTestCase(TestCase):
    def test_first(self):
        answers = three(self.client)
        self.assertEqual([a.status_code for a in answers], [200, 200, 429])
        assert_charged(answers[0], "login", 1)
        assert_charged(answers[2], "login", 0)

    def test_second(self):
        self.assertEqual([a.status_code for a in three(self.client)], [200, 200, 429])

    async def test_async(self):
        answers = [await self.async_client.get("/search/") for _ in range(3)]
        self.assertEqual([a.status_code for a in answers], [200, 200, 429])


class TestWithTransactionTestCase(TransactionTestCase):
    def test_first(self):
        self.assertEqual([a.status_code for a in three(self.client)], [200, 200, 429])

    def test_second(self):
        self.assertEqual([a.status_code for a in three(self.client)], [200, 200, 429])
'''

PYTEST_TESTS = '''
import pytest

from ratelimit_app import registry
from ratelimit_app.models import Policy
from ratelimit_app.testing import assert_charged


@pytest.mark.django_db
def test_function_first(client):
    assert [client.get("/login/").status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.django_db
def test_function_second(client):
    response = client.get("/login/")
    assert_charged(response, "login", 1)
    assert [client.get("/login/").status_code for _ in range(2)] == [200, 429]


@pytest.mark.django_db(transaction=True)
async def test_async_function(async_client):
    assert [(await async_client.get("/search/")).status_code for _ in range(3)] == [200, 200, 429]


def test_the_server_is_named(ratelimit_server):
    assert ratelimit_server.url.startswith("redis://127.0.0.1:")


@pytest.mark.django_db
def test_declares_a_policy_in_code(client):
    registry.declare_policy("declared-by-a-test", action="tiny:declared", rate="9/m", key="ip", origin="a test")
    assert client.get("/login/").status_code == 200  # its row is written with the others'


@pytest.mark.django_db
def test_the_next_test_lists_only_the_views_policies(client):
    assert client.get("/login/").status_code == 200
    assert sorted(Policy.objects.values_list("name", flat=True)) == ["login", "search"]
'''


@pytest.fixture
def tiny(pytester, monkeypatch):
    """The tiny project, its tests, and a shell's environment without this suite's server or settings."""
    pytester.mkpydir("tinysite")
    pytester.path.joinpath("tinysite", "settings.py").write_text(SETTINGS % {"port": free_port()})
    pytester.path.joinpath("tinysite", "urls.py").write_text(URLS)
    pytester.makepyfile(test_cases=TESTS, test_functions=PYTEST_TESTS)
    pytester.makeini("[pytest]\nDJANGO_SETTINGS_MODULE = tinysite.settings\nasyncio_mode = auto\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    for name in ("REDIS_URL", "RATELIMIT_TEST_REDIS_URL", "DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(ROOT)]))
    return pytester


MANAGE = '''
import multiprocessing
import os
import sys

from django.core.management import execute_from_command_line

if __name__ == "__main__":
    if os.environ.get("START_METHOD"):  # spawn: macOS's default, where workers inherit nothing
        multiprocessing.set_start_method(os.environ["START_METHOD"])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tinysite.settings")
    execute_from_command_line(sys.argv)
'''

ALL = 11  # tests in the two files


# plugins of this checkout's environment that the tiny project does not use (hypothesis's; the benchmarked
# library's, installed by the bench): importing them was most of each run's CPU
UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:django_smart_ratelimit")


def run_pytest(pytester, *args: str):
    # the entry point of an installed package, given by name here: this tree is not installed
    return pytester.runpytest_subprocess("-p", "ratelimit_app.pytest_plugin", "-p", "no:cacheprovider",
                                         *UNUSED_PLUGINS, *args)


def server_line(result) -> str:
    return next(line for line in result.outlines if line.startswith("ratelimit_app: Redis-compatible server"))


def refuses_connections(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except redis.ConnectionError:
        return True
    return False


def test_testcase_transactiontestcase_function_and_async_tests_pass_against_a_server_started_and_stopped(tiny):
    result = run_pytest(tiny, "-p", "no:randomly")
    result.assert_outcomes(passed=ALL)
    said = server_line(result)
    assert "not started by ratelimit_app" not in said
    assert refuses_connections(said.split()[3])  # stopped with the session


@pytest.mark.parametrize("seed", [1, 2])
def test_a_test_that_reached_a_limit_leaves_the_next_unlimited_in_any_order(tiny, seed):
    run_pytest(tiny, "-p", "randomly", f"--randomly-seed={seed}").assert_outcomes(passed=ALL)


def test_a_server_that_cannot_be_started_is_a_usage_error_that_says_which(tiny, monkeypatch):
    monkeypatch.setenv("RATELIMIT_REDIS_SERVER", "/nonexistent/valkey-server")
    result = run_pytest(tiny)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: ratelimit_app: Could not start the Redis-compatible server "
                                 "/nonexistent/valkey-server (RATELIMIT_REDIS_SERVER): *No such file*"])


def test_without_the_plugin_the_same_tests_fail(tiny):
    result = tiny.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *UNUSED_PLUGINS)
    # every request refused with 503 (the settings' server is not there); no ratelimit_server fixture
    result.assert_outcomes(failed=ALL - 1, errors=1)


def test_a_project_without_a_redis_cache_gets_one_added(tiny):
    settings = tiny.path / "tinysite" / "settings.py"
    settings.write_text(settings.read_text().replace('RATELIMIT_CACHE = "ratelimit"', ""))  # "default": LocMemCache
    run_pytest(tiny, "-p", "no:randomly").assert_outcomes(passed=ALL)
    done = manage_test(tiny, "--testrunner", "ratelimit_app.testing.RatelimitTestRunner")
    assert done.returncode == 0 and "Ran 5 tests" in done.stderr, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout + done.stderr  # nothing to say of the added cache


@pytest.mark.parametrize("how", ["REDIS_URL", "RATELIMIT_TEST_REDIS_URL", "--ratelimit-redis"])
def test_a_server_the_user_names_is_used_and_only_the_apps_keys_are_deleted(tiny, monkeypatch, private, how):
    mine = redis.Redis.from_url(private.url)
    mine.set("mine", "kept")
    last = ("-p", "no:randomly", "-k", "not server_is_named")  # the last test to run leaves counters
    if how.startswith("--"):
        result = run_pytest(tiny, *last, f"{how}={private.url}")
    else:
        monkeypatch.setenv(how, private.url)
        result = run_pytest(tiny, *last)
    result.assert_outcomes(passed=ALL - 1)
    assert server_line(result).startswith(f"ratelimit_app: Redis-compatible server {private.url} (")
    assert "not started by ratelimit_app" in server_line(result)
    assert mine.get("mine") == b"kept"
    assert mine.keys("rl:*"), "the last test's counters are in the named server"


def test_each_xdist_worker_has_a_server_of_its_own(tiny):
    pytest.importorskip("xdist")
    run_pytest(tiny, "-n", "2", "-p", "randomly", "--randomly-seed=1").assert_outcomes(passed=ALL)


def test_each_xdist_worker_keeps_its_own_counters_on_a_server_the_user_names(tiny, monkeypatch, private):
    pytest.importorskip("xdist")
    monkeypatch.setenv("REDIS_URL", private.url)
    run_pytest(tiny, "-n", "2", "-p", "randomly", "--randomly-seed=1").assert_outcomes(passed=ALL)
    prefixes = {key.split(b":")[0] for key in redis.Redis.from_url(private.url).keys("rl-*")}
    assert prefixes <= {b"rl-gw0", b"rl-gw1"} and prefixes


def manage_test(pytester, *args: str, start_method: str = "") -> subprocess.CompletedProcess:
    pytester.path.joinpath("manage.py").write_text(MANAGE)
    return subprocess.run([sys.executable, "manage.py", "test", "test_cases", "-v", "2", *args], cwd=pytester.path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "START_METHOD": start_method})


@pytest.mark.parametrize("parallel, start_method", [([], ""), (["--parallel", "2"], "fork"),
                                                    (["--parallel", "2"], "spawn")])
def test_manage_py_test_with_the_runner_passes_against_a_server_it_starts(tiny, parallel, start_method):
    done = manage_test(tiny, "--testrunner", "ratelimit_app.testing.RatelimitTestRunner", *parallel,
                       start_method=start_method)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Ran 5 tests" in done.stderr and "OK" in done.stderr
    assert "ratelimit_app: tests use redis://127.0.0.1:" in done.stdout


def test_manage_py_test_without_the_runner_fails(tiny):
    done = manage_test(tiny)
    assert done.returncode == 1 and "FAILED" in done.stderr
