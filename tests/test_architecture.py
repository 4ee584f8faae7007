"""The package's shape is checked, not hoped for: import-linter's contracts (.importlinter) fail the
suite on an upward import or an import cycle, counting imports inside functions and TYPE_CHECKING."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ratelimit_app"


def test_the_layers_import_one_way_and_no_module_imports_itself_back():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_every_module_of_the_package_has_its_layer():
    layers = (ROOT / ".importlinter").read_text().split("layers =", 1)[1].split("[importlinter", 1)[0]
    placed = {name.strip() for line in layers.splitlines() for name in line.replace("|", ":").split(":") if name.strip()}
    package = ROOT / "ratelimit_app"
    modules = {
        "ratelimit_app." + (path.stem if path.suffix == ".py" else path.name)
        for path in package.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert modules - placed == set()


def test_one_module_reacts_to_changed_settings():
    listening = sorted(
        str(path.relative_to(ROOT)) for path in (ROOT / "ratelimit_app").rglob("*.py") if "setting_changed" in path.read_text()
    )
    assert listening == ["ratelimit_app/runtime.py"]


def test_the_package_keeps_to_one_line_length():
    """120 columns (pyproject.toml [tool.ruff]), in the Python and in the Lua beside it."""
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run([str(ruff), "check", "--select", "E501", "ratelimit_app"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    long_lua = [f"{path.name}:{number}" for path in sorted((ROOT / "ratelimit_app" / "lua").glob("*.lua"))
                for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 120]
    assert long_lua == []


# a path with a folder (lua/x.lua, docs/a/b.md, tests/x.py, strategies/x.py), or a bare file name of a
# script, a module or a Markdown file; placeholders (lua/<name>.lua) and templates ({name}.lua) are not files
CITED_PATH = re.compile(r"(?<![\w/.<>{}@-])((?:[\w.-]+/)+[\w.-]+\.(?:py|lua|md|html|txt|js|css|toml|ini|cfg))(?![\w/])")
CITED_NAME = re.compile(r"(?<![\w/.<>{}@'\"-])([\w-]+\.(?:py|lua|md))\b(?![\w/(])")


def _comments_and_docstrings(path: Path):
    """(line, text) of every comment and docstring of a module, or every comment of a Lua script."""
    source = path.read_text()
    if path.suffix == ".lua":
        for number, line in enumerate(source.splitlines(), 1):
            if "--" in line:
                yield number, line[line.index("--"):]
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield node.body[0].lineno, docstring


def test_every_file_a_comment_or_docstring_of_the_package_cites_exists():
    """A file named in the package's words (`lua/quota.lua`, `docs/...md`, `decide.lua`) is one a
    reader can open: from the repository's root, the package, or the citing file's folder."""
    files = [path for path in sorted(PACKAGE.rglob("*")) if path.suffix in (".py", ".lua") and "migrations" not in
             path.relative_to(PACKAGE).parts]
    names = {path.name for folder in ("ratelimit_app", "tests", "docs", "bench", "project", "scripts")
             for path in (ROOT / folder).rglob("*")} | {path.name for path in ROOT.iterdir()}
    missing = []
    for path in files:
        for line, text in _comments_and_docstrings(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            missing += [f"{where}: {cited}" for cited in CITED_PATH.findall(text)
                        if not any((base / cited).exists() for base in (ROOT, PACKAGE, path.parent))]
            missing += [f"{where}: {cited}" for cited in CITED_NAME.findall(text)
                        if not ((PACKAGE / "lua" / cited).exists() if cited.endswith(".lua") else cited in names)]
    assert len(files) > 100
    assert missing == []


def test_one_function_computes_the_limit_in_effect():
    """The override, then the plan, then the policy's limit: plans.limit_in_effect over what the index
    gathers of a request (PolicyIndex.limits_for); no module but these looks up overrides or plans for it."""
    looking_up = re.compile(r"(?<!def )\b(matching_override|plan_of|first_active|RequestLimits)\(")
    found = sorted(
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if looking_up.search(path.read_text())
    )
    assert found == ["overrides.py", "plans.py", "policies.py"]
