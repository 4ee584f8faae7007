"""The package as a new user gets it: built from this tree, installed in a fresh virtualenv beside a new
`django-admin startproject` that gets the README's settings verbatim, it answers 429.

Two virtualenvs: one from the built wheel without Django REST framework (middleware, decorator, admin
and commands must all work there), one by the README's `pip install ".[drf,hiredis]"` from a copy of
the source tree. Dependencies come from the index at the versions pinned in requirements.txt.
RATELIMIT_PACKAGE_PYTHON names another interpreter for the virtualenvs (e.g. a python3.13).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.slow  # a wheel, two virtualenvs, two projects: about half a minute

SOURCE_FILES = ("pyproject.toml", "README.md", "ratelimit_app")

POLICIES = {
    "format": "ratelimit_app/1",
    "policies": [
        # matched by URL name: the middleware resolves the URL, the path that once needed DRF
        {"name": "hello-per-ip", "action": "hello", "limit": 2, "window": 60, "strategy": "fixed_window", "key": "ip"},
        {"name": "sign-in-per-ip", "action": "login", "limit": 1, "window": 60, "strategy": "sliding_log", "key": "ip"},
        # counts users: `manage.py check` would warn if the README put the middleware in the wrong place
        {"name": "items-per-user", "action": "items", "limit": 1, "window": 60, "strategy": "sliding_window",
         "key": "user_or_ip"},
    ],
}

VIEWS = '''
from django.http import HttpResponse

from ratelimit_app.decorators import ratelimit


def hello(request):
    return HttpResponse("hello")


@ratelimit("login")
def sign_in(request):
    return HttpResponse("welcome")
'''

DRF_VIEWS = '''
from rest_framework.response import Response
from rest_framework.views import APIView


class Items(APIView):
    throttle_scope = "items"

    def get(self, request):
        return Response({"items": []})
'''

URLS = '''
from mysite import views

urlpatterns += [path("hello/", views.hello, name="hello"), path("sign-in/", views.sign_in, name="sign-in")]
'''

DRF_URLS = '''
urlpatterns += [path("items/", views.Items.as_view(), name="items-api")]
'''

# Run inside the new project with its own Python: what a user's browser and shell would see.
PROOF = '''
import json, sys

import django
from django.test import Client
from django.test.utils import setup_test_environment

django.setup()
setup_test_environment()  # lets the test client's host in
import ratelimit_app
from django.contrib.auth.models import User
from ratelimit_app.models import Policy

client = Client()
found = {"package": ratelimit_app.__file__}
hello = [client.get("/hello/") for _ in range(3)]
found["hello"] = [response.status_code for response in hello]
found["hello_policy_header"] = hello[0].headers.get("RateLimit-Policy")
found["sign_in"] = [client.post("/sign-in/").status_code for _ in range(2)]
if "items" in sys.argv:
    found["items"] = [client.get("/items/").status_code for _ in range(2)]
admin = User.objects.create_superuser("admin", "admin@example.com", "password")
client.force_login(admin)
policy = Policy.objects.get(name="hello-per-ip")
found["admin"] = [client.get(url).status_code for url in (
    "/admin/ratelimit_app/policy/", f"/admin/ratelimit_app/policy/{policy.pk}/change/",
    f"/admin/ratelimit_app/policy/{policy.pk}/live/",
)]
print(json.dumps(found))
'''


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Using it in your project")
    return text[start : text.index("\n## ", start + 1)]


def readme_settings(needle: str) -> str:
    """The python block of the README's 'Using it in your project' that contains `needle`."""
    return next(block for block in re.findall(r"```python\n(.*?)```", readme_section(), re.S) if needle in block)


def readme_drf_install() -> list[str]:
    command = re.search(r'`(pip install "\.\[drf[^`]*)`', readme_section()).group(1)
    return shlex.split(command)


def pinned_constraints(directory: Path) -> Path:
    """requirements.txt as a constraints file (pip refuses extras there: psycopg[binary] -> psycopg)."""
    lines = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if "==" in requirement and not requirement.startswith("-"):
            lines.append(re.sub(r"\[.*?\]", "", requirement))
    path = directory / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise AssertionError(f"{shlex.join(map(str, command))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def clean_env() -> dict[str, str]:
    """A shell's environment: nothing of this test session's Django or source tree, but its Redis."""
    dropped = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST", "DATABASE_URL")
    return {name: value for name, value in os.environ.items() if name not in dropped}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("package")


@pytest.fixture(scope="module")
def source(workspace) -> Path:
    """A copy of what the package is built from (so nothing of the demo can leak in, and the tree stays clean)."""
    copy = workspace / "source"
    copy.mkdir()
    for name in SOURCE_FILES:
        original = ROOT / name
        if original.is_dir():
            shutil.copytree(original, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(original, copy / name)
    return copy


@pytest.fixture(scope="module")
def wheel(workspace, source) -> Path:
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(workspace / "dist"), str(source)], cwd=workspace)
    (built,) = (workspace / "dist").glob("ratelimit_app-*.whl")
    return built


class Site(NamedTuple):
    environment: Path  # the virtualenv
    directory: Path  # the project startproject made

    @property
    def python(self) -> Path:
        return self.environment / "bin" / "python"


def new_site(workspace: Path, name: str, install: list[str], cwd: Path, drf: bool) -> Site:
    """A fresh virtualenv with `pip install ...install` (run in `cwd`), and a new project for it."""
    environment = new_virtualenv(workspace / f"venv-{name}", install, cwd)
    return Site(environment, new_project(environment, workspace / f"site-{name}", drf))


def new_virtualenv(environment: Path, install: list[str], cwd: Path) -> Path:
    interpreter = os.environ.get("RATELIMIT_PACKAGE_PYTHON", sys.executable)
    run([interpreter, "-m", "venv", "--without-pip", str(environment)], cwd=cwd)  # our own pip installs into it
    constraints = pinned_constraints(environment)
    python = environment / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "-c", str(constraints), *install], cwd=cwd)
    return environment


def new_project(environment: Path, site: Path, drf: bool) -> Path:
    """`django-admin startproject`, the README's settings appended verbatim, a few views and policies."""
    site.mkdir()
    run([str(environment / "bin" / "django-admin"), "startproject", "mysite", str(site)], cwd=site)
    settings = site / "mysite" / "settings.py"
    snippets = [readme_settings("RateLimitMiddleware")] + ([readme_settings("PolicyThrottle")] if drf else [])
    settings.write_text(
        settings.read_text()
        + "\n# The README's settings, verbatim\n" + "\n".join(snippets)
        + "\n# This test session's private server instead of the README's\n"
        + 'import os\nCACHES["default"]["LOCATION"] = os.environ["REDIS_URL"]\n'
    )
    (site / "mysite" / "views.py").write_text(VIEWS + (DRF_VIEWS if drf else ""))
    urls = site / "mysite" / "urls.py"
    urls.write_text(urls.read_text() + URLS + (DRF_URLS if drf else ""))
    (site / "policies.json").write_text(json.dumps(POLICIES))
    (site / "proof.py").write_text(PROOF)
    return site


@pytest.fixture(scope="module")
def site_without_drf(workspace, wheel) -> Site:
    return new_site(workspace, "bare", [f"{wheel}[hiredis]"], cwd=workspace, drf=False)


@pytest.fixture(scope="module")
def site_with_drf(workspace, source) -> Site:
    return new_site(workspace, "drf", readme_drf_install()[2:], cwd=source, drf=True)


def manage(site: Site, *args: str) -> str:
    return run([str(site.python), "manage.py", *args], cwd=site.directory)


def prove(site: Site, *args: str) -> dict:
    """Migrate, import the policies, check, then what proof.py saw; always the installed package."""
    manage(site, "migrate", "-v", "0")
    assert "Imported 3 policies" in manage(site, "ratelimit_import", "policies.json")
    exported = json.loads(manage(site, "ratelimit_export"))
    assert sorted(p["name"] for p in exported["policies"]) == sorted(p["name"] for p in POLICIES["policies"])
    # the README's settings are complete: no error and no warning (cache, timeouts, middleware order)
    manage(site, "check", "--fail-level", "WARNING")
    env = {**clean_env(), "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    found = json.loads(run([str(site.python), "proof.py", *args], cwd=site.directory, env=env))
    assert found["package"].startswith(str(site.environment)), "the installed package, not this tree, answered"
    return found


def test_the_wheel_holds_the_app_with_its_data_files_and_nothing_of_the_demo(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert all(name.startswith(("ratelimit_app/", "ratelimit_app-")) for name in names), names
    for needed in ("ratelimit_app/lua/decide.lua", "ratelimit_app/py.typed", "ratelimit_app/migrations/0001_initial.py",
                   "ratelimit_app/templates/admin/ratelimit_app/policy/live.html",
                   "ratelimit_app/management/commands/ratelimit_import.py"):
        assert needed in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "Requires-Python: >=3.11" in metadata
    assert "Provides-Extra: drf" in metadata and "Provides-Extra: hiredis" in metadata


def test_a_new_project_without_drf_limits_through_middleware_decorator_admin_and_commands(site_without_drf):
    no_drf = "import importlib.util, sys; sys.exit(importlib.util.find_spec('rest_framework') is not None)"
    run([str(site_without_drf.python), "-c", no_drf], cwd=site_without_drf.directory)
    found = prove(site_without_drf)
    assert found["hello"] == [200, 200, 429]
    assert found["hello_policy_header"] == '"hello-per-ip";q=2;w=60'
    assert found["sign_in"] == [200, 429]
    assert found["admin"] == [200, 200, 200]


def test_a_new_project_with_drf_installed_as_the_readme_says_limits_drf_views_too(site_with_drf):
    found = prove(site_with_drf, "items")
    assert found["hello"] == [200, 200, 429]
    assert found["sign_in"] == [200, 429]
    assert found["items"] == [200, 429]
    assert found["admin"] == [200, 200, 200]
