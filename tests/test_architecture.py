"""The package's shape is checked, not hoped for: import-linter's contracts (.importlinter) fail the
suite on an upward import or an import cycle, counting imports inside functions and TYPE_CHECKING."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
