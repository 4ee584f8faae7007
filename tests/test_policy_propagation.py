"""A policy created, edited, disabled or deleted elsewhere is obeyed by every worker, told by the policy
version in Redis (the periodic reload is out of the way)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.servers import ROOT, Server, fetch, manage, site_env

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(tmp_path):
    env = site_env(tmp_path / "site.sqlite3", DJANGO_SETTINGS_MODULE="tests.propagation_settings")
    manage(env, "migrate", "--noinput")
    servers = [Server(env), Server(env)]
    try:
        yield env, servers
    finally:
        for server in servers:
            server.stop()


def until_obeyed(condition, servers, deadline=60.0) -> None:
    """Poll every server until `condition(status, headers)` holds on all (the deadline only stops a loop
    that would never end: the index reload that would also bring the change is a day away)."""
    give_up = time.monotonic() + deadline
    pending = list(servers)
    while pending:
        assert time.monotonic() < give_up, "a worker never obeyed the change"
        pending = [s for s in pending if not condition(*fetch(s.url + "/demo/search/?q=a", **{"X-Forwarded-For": "x"}))]
        time.sleep(0.02)


# one `manage.py shell` for every change: each piece of code on a line of its stdin, "done" once it ran
# (a process per change started Django six times for a few statements)
LOOP = """
import json, sys
from ratelimit_app.models import Policy
for line in sys.stdin:
    exec(json.loads(line))
    print("done", flush=True)
"""


class Shell:
    """A `manage.py shell` of the site's, elsewhere than its workers, that runs the code it is given."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", LOOP], cwd=ROOT, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, code: str) -> None:
        self.process.stdin.write(json.dumps(code) + "\n")
        self.process.stdin.flush()
        said = iter(self.process.stdout.readline, "")  # to its end of file, should it die
        assert "done\n" in said, f"the shell failed on {code!r} (its error is above)"

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


@pytest.fixture
def shell(workers):
    elsewhere = Shell(workers[0])
    yield elsewhere
    elsewhere.close()


def test_changes_reach_every_worker_through_the_policy_version(workers, shell):
    servers = workers[1]
    for server in servers:  # both workers have loaded their (empty) index
        assert "RateLimit" not in fetch(server.url + "/demo/search/")[1]

    shell("Policy.objects.create(name='search', action='demo:search', limit=1000, window=60, strategy='fixed_window', key='global')")
    until_obeyed(lambda status, headers: "RateLimit" in headers, servers)

    shell("p = Policy.objects.get(name='search'); p.limit = 1; p.save()")
    until_obeyed(lambda status, headers: status == 429, servers)

    shell("p = Policy.objects.get(name='search'); p.enabled = False; p.save()")
    until_obeyed(lambda status, headers: status == 200 and "RateLimit" not in headers, servers)

    shell("p = Policy.objects.get(name='search'); p.enabled = True; p.save()")
    until_obeyed(lambda status, headers: status == 429, servers)

    shell("from ratelimit_app.models import Override\n"
          "Override.objects.create(policy=Policy.objects.get(name='search'), kind='ip', network='127.0.0.1', limit=100000)")
    until_obeyed(lambda status, headers: status == 200 and '"search";q=100000' in headers.get("RateLimit-Policy", ""), servers)
    shell("Policy.objects.get(name='search').delete()")
    until_obeyed(lambda status, headers: status == 200 and "RateLimit" not in headers, servers)

