"""The documentation stays true: it builds with warnings as errors, and its settings and system checks
reference lists everything the code has (a new setting or check id without its entry fails here)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from ratelimit_app.conf import DEFAULTS
from tests.servers import ROOT

DOCS = ROOT / "docs"


def reference(name: str) -> str:
    return (DOCS / "reference" / name).read_text()


def check_ids_in_code() -> set[str]:
    found = set()
    for module in (ROOT / "ratelimit_app").rglob("*.py"):
        found.update(re.findall(r"id=f?[\"'](ratelimit_app\.[EW]\d{3})[\"']", module.read_text()))
    return found


def test_every_setting_is_in_the_reference_with_its_default():
    documented = dict(re.findall(r"^## `(RATELIMIT_\w+)`\n\nDefault: `(.*?)`$", reference("settings.md"), re.M))
    assert sorted(documented) == sorted(DEFAULTS), "docs/reference/settings.md lists other settings than conf.DEFAULTS"
    wrong = {name: text for name, text in documented.items() if ast.literal_eval(text) != DEFAULTS[name]}
    assert not wrong, f"defaults in docs/reference/settings.md differ from conf.DEFAULTS: {wrong}"


def test_every_system_check_id_is_in_the_reference():
    ids = check_ids_in_code()
    assert len(ids) >= 12, ids  # the pattern still finds the checks
    documented = set(re.findall(r"^## `(ratelimit_app\.[EW]\d{3})`$", reference("checks.md"), re.M))
    assert ids - documented == set(), "system checks missing from docs/reference/checks.md"
    assert documented - ids == set(), "docs/reference/checks.md lists checks the code no longer has"


def test_every_strategy_is_explained_with_its_trade_offs():
    """The reference lists the strategies from the registry (docs/_ext/strategy_list.py); the explanation
    is written by hand, and a strategy added fails here until it has its row there."""
    from ratelimit_app.strategies import STRATEGIES

    explained = set(re.findall(r"^\| `(\w+)` \|", (DOCS / "explanation" / "strategies.md").read_text(), re.M))
    assert set(STRATEGIES) - explained == set(), "docs/explanation/strategies.md leaves out a strategy"


def test_the_readme_is_short_and_names_the_package():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "`ratelimit-app`" in readme and "`ratelimit_app`" in readme
    assert "pip wheel" not in readme  # it drops every dependency's wheel into the checkout


def test_the_docs_never_send_users_to_maintainers_notes():
    pages = [ROOT / "README.md", *DOCS.rglob("*.md")]
    for page in pages:
        text = page.read_text()
        for word in ("DESIGN.md", "STYLE.md", "seeds/"):
            assert word not in text, f"{page.relative_to(ROOT)} mentions {word}"


@pytest.mark.slow
def test_the_documentation_builds_without_a_warning(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "html" / "reference" / "settings.html").exists()


def test_contributing_says_when_the_private_servers_line_comes_and_quotes_it(tmp_path):
    contributing = " ".join((ROOT / "CONTRIBUTING.md").read_text().split())
    assert "on a first run pip's output comes before it" in contributing  # not "the first line printed"
    done = subprocess.run([sys.executable, "-m", "project.devredis", "--", sys.executable, "-c", "pass"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "REDIS_URL"})
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()[0]
    assert said.startswith("Started a private Redis-compatible server at redis://127.0.0.1:")
    assert "`Started a private Redis-compatible server at redis://127.0.0.1:PORT/0: BINARY (ORIGIN)`" in contributing


@pytest.mark.slow
def test_an_api_reference_entry_without_a_docstring_fails_the_build(tmp_path):
    (tmp_path / "undocumented.py").write_text('class Documented:\n    """Says what it is."""\n\n\nclass Bare:\n    pass\n')
    (tmp_path / "conf.py").write_text(
        f"import sys\nsys.path[:0] = [{str(tmp_path)!r}, {str(DOCS / '_ext')!r}]\n"
        "extensions = ['sphinx.ext.autodoc', 'no_empty_entries']\n"
    )
    (tmp_path / "index.rst").write_text("API\n===\n\n.. autoclass:: undocumented.Documented\n.. autoclass:: undocumented.Bare\n")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(tmp_path), str(tmp_path / "html")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "undocumented.Bare has no docstring" in done.stderr and "Documented has no" not in done.stderr



def test_the_admin_menus_the_docs_name_are_the_admins():
    from django.apps import apps
    from django.utils.text import capfirst

    app = apps.get_app_config("ratelimit_app")
    sections = {app.verbose_name} | {str(capfirst(m._meta.verbose_name_plural)) for m in app.get_models()}
    named = [
        (page.name, first)
        for page in [*DOCS.rglob("*.md"), ROOT / "README.md"] if "_build" not in page.parts
        for first in re.findall(r"\*([A-Z][A-Za-z ]+) > [^*\n]+\*", page.read_text())
    ]
    assert named, "the pattern still finds the admin's menus"
    assert [(page, first) for page, first in named if first not in sections] == []
