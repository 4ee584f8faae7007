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


def _redis_private_names() -> set[str]:
    """The private attributes redis-py's connections, pools, clients and retries hold (made, not connected)."""
    import redis
    import redis.asyncio
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    made = [redis.Connection(), redis.asyncio.Connection(), redis.ConnectionPool(), redis.Redis(),
            Retry(NoBackoff(), 1), redis.asyncio.retry.Retry(NoBackoff(), 1)]
    names = {name for thing in made for name in vars(thing)}
    names |= {name for thing in made for klass in type(thing).__mro__ for name in vars(klass)}
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_redis_pys_private_attributes_are_read_in_one_module():
    """A redis-py release that renames one is mended in one place (engine/clients.py), not wherever it was read."""
    import ast

    private = _redis_private_names()
    reaching = set()
    for path in (ROOT / "ratelimit_app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in private
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "super"))):
                reaching.add(str(path.relative_to(ROOT)))
    assert reaching <= {"ratelimit_app/engine/clients.py"}, reaching


def test_the_engine_reaches_no_database():
    """Neither the engine nor any module of the package it imports, however indirectly, imports django.db
    (import-linter names external packages whole: this part of its contract is checked here)."""
    import ast

    import grimp

    graph = grimp.build_graph("ratelimit_app")
    reached = {"ratelimit_app.engine", *graph.find_children("ratelimit_app.engine")}
    reached |= graph.find_upstream_modules("ratelimit_app.engine", as_package=True)
    importing = set()
    for module in reached:
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(name == "django.db" or name.startswith("django.db.") for name in names):
                importing.add(module)
    assert "ratelimit_app.engine.decision" in reached and "ratelimit_app.values" in reached
    assert importing == set(), importing


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
    """The override, then the plan, then the policy's limit: limit_in_effect (subjects/matching.py, which plans.py
    re-exports) over what the index gathers of a request (its limits_for: matching.limits_of); no other module
    looks up overrides or plans for it."""
    looking_up = re.compile(r"(?<!def )\b(matching_override|plan_of|first_active|RequestLimits)\(")
    found = sorted(
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if looking_up.search(path.read_text())
    )
    assert found == ["subjects/matching.py"]


# The one place the package replaces a request's close(), and why: Django 5.2 and 6.0 under ASGI close the
# response in a context that never saw the request's Closing (closing.py says where in Django's handler).
REPLACES_CLOSE = {("closing.py", "_asgi_close_in_context_before_django_61")}


def test_one_module_sends_what_a_request_holds_through_djangos_public_hooks():
    """closing.py alone gives places back (engine.release / arelease); no module reads a response's body or
    closers past its public API (`_resource_closers`, `_iterator`, `_handler_class`, `_container`), and none
    replaces a request's or a response's close() but the one function for ASGI before Django 6.1."""
    import ast

    giving_back, private, closes = set(), set(), set()
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text())
        functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("release", "arelease") and \
                    isinstance(node.value, ast.Name) and node.value.id == "engine":
                giving_back.add(where)
            if isinstance(node, ast.Attribute) and node.attr in (
                    "_iterator", "_resource_closers", "_handler_class", "_container"):
                private.add((where, node.attr))
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AnnAssign, ast.AugAssign)) else []
            if any(isinstance(target, ast.Attribute) and target.attr == "close" for target in targets) or (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "close"):
                # the outermost function it is written in names it
                inside = [f.name for f in functions if f.lineno <= node.lineno <= f.end_lineno]
                closes.add((where, inside[0] if inside else "<module>"))
    assert giving_back == {"closing.py"}
    assert private == set(), private
    assert closes <= REPLACES_CLOSE, closes - REPLACES_CLOSE
