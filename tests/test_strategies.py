"""A strategy is one unit, strategies/<name>.py beside lua/<name>.lua: adding one needs no migration,
the admin offers and checks it from the registry, and no other module or template names one."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured, ValidationError

from ratelimit_app import strategies
from ratelimit_app.models import Policy
from tests.added_strategy import CURRENT, EARLIER, Leaky, Scratch
from tests.servers import ROOT, site_env
from tests.test_admin import FORM

PACKAGE = ROOT / "ratelimit_app"
ADD = "/admin/ratelimit_app/policy/add/"


# the registry grows before the models are built, as when strategies/leaky_bucket.py is added
ADDED_BEFORE_THE_MODELS = """
import django
from ratelimit_app import strategies
from tests.added_strategy import Leaky
strategies.STRATEGIES["leaky_bucket"] = Leaky()
django.setup()
from django.core.management import call_command
from ratelimit_app.models import Policy
print(dict(Policy._meta.get_field("strategy").flatchoices)["leaky_bucket"])
call_command("makemigrations", "--check", "--dry-run", "ratelimit_app")
"""


def test_a_strategy_added_needs_no_migration(tmp_path):
    done = subprocess.run([sys.executable, "-c", ADDED_BEFORE_THE_MODELS], cwd=ROOT,
                          env=site_env(tmp_path / "db.sqlite3"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["Leaky bucket", "No changes detected in app 'ratelimit_app'"]


@pytest.fixture
def leaky(monkeypatch):
    monkeypatch.setitem(strategies.STRATEGIES, "leaky_bucket", Leaky())


@pytest.mark.django_db
def test_the_admin_offers_a_strategy_registered_at_run_time_and_the_model_accepts_it(admin_client, leaky):
    page = admin_client.get(ADD).content.decode()
    assert '<option value="leaky_bucket">Leaky bucket</option>' in page
    assert "leaky_bucket: a queue drained at a steady rate." in page  # the help text reads the registry too
    Policy(name="queue", action="*", limit=5, window=60, strategy="leaky_bucket", burst=20).full_clean()


@pytest.mark.django_db
def test_a_strategy_not_registered_is_refused_with_the_list_of_those_that_are(admin_client):
    refusal = f"leaky_bucket is not a strategy of this site; choose one of {', '.join(strategies.STRATEGIES)}."
    response = admin_client.post(ADD, {**FORM, "strategy": "leaky_bucket"})
    assert response.context["adminform"].form.errors["strategy"] == [refusal]
    with pytest.raises(ValidationError) as refused:
        Policy(name="queue", action="*", limit=5, window=60, strategy="leaky_bucket").full_clean()
    assert refused.value.message_dict["strategy"] == [refusal]


def test_every_strategy_has_its_python_and_its_lua_half_and_a_name_the_field_holds():
    for name, strategy in strategies.STRATEGIES.items():
        assert len(name) <= Policy._meta.get_field("strategy").max_length, name
        assert (PACKAGE / "strategies" / f"{name}.py").exists(), name
        assert (PACKAGE / "lua" / strategy.lua).exists(), name


def _code_naming(path, names: re.Pattern) -> list[str]:
    """Where the code of a module names a strategy: a string (docstrings aside) or an identifier."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, (ast.Attribute, ast.Name)):
            text = node.attr if isinstance(node, ast.Attribute) else node.id
        else:
            continue
        if names.search(text):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text[:60]!r}")
    return found


def test_no_module_or_template_outside_the_strategies_names_one():
    """What differs between strategies is asked of the registry (strategies/<name>.py), so that a
    strategy added or removed changes nothing elsewhere."""
    names = re.compile(r"\b(" + "|".join(strategies.STRATEGIES) + r")\b", re.IGNORECASE)
    elsewhere = {"strategies", "migrations"}
    found = [
        where for path in sorted(PACKAGE.rglob("*.py")) if elsewhere.isdisjoint(path.relative_to(PACKAGE).parts)
        for where in _code_naming(path, names)
    ]
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".html", ".txt", ".js", ".css"):
            lines = enumerate(path.read_text().splitlines(), 1)
            found += [f"{path.relative_to(ROOT)}:{number}" for number, line in lines if names.search(line)]
    assert found == []


def _refusal(strategy) -> str:
    """What the registry says when it is asked to load this site's strategies and `strategy`."""
    with pytest.raises(ImproperlyConfigured) as refused:
        strategies.registry([*strategies.STRATEGIES.values(), strategy])
    return str(refused.value)


def test_a_scratch_strategy_that_can_count_is_loaded():
    loaded = strategies.registry([*strategies.STRATEGIES.values(), Scratch()])
    assert list(loaded) == [*strategies.STRATEGIES, "scratch"]


def test_a_strategy_reusing_a_letter_is_refused_with_both_names():
    """Two strategies with one letter share counter keys: a policy moved from sliding_log to the other
    read the log's sorted set, and Redis answered WRONGTYPE."""
    reused = type("Reused", (Scratch,), {"letter": strategies.get("sliding_log").letter})()
    assert _refusal(reused) == (
        "Strategies refused: the strategies 'sliding_log' and 'scratch' share the letter 'l': their counters "
        "would share keys, and a policy moved from one to the other would read the other's (or fail with "
        "WRONGTYPE)."
    )


def test_a_strategy_without_a_reference_model_is_refused_with_its_name():
    unchecked = type("Unchecked", (Scratch,), {"reference": ""})()
    assert _refusal(unchecked) == (
        "Strategies refused: the strategy 'scratch' declares no reference model: set its `reference` to the "
        "test that decides it against one (tests/<file>.py::<name>)."
    )


def test_a_strategy_whose_lua_speaks_the_earlier_contract_is_refused_with_its_name():
    earlier = type("Earlier", (Scratch,), {"source": EARLIER})()
    assert _refusal(earlier) == (
        "Strategies refused: the strategy 'scratch': lua/scratch.lua does not define look, charge, refund on "
        "strategies.scratch (it speaks the earlier contract: peek, take, undo); lua/contract.lua says what each does."
    )
    partial = type("Partial", (Scratch,), {"source": CURRENT.replace("refund =", "give_back =")})()
    assert "lua/scratch.lua does not define refund on strategies.scratch;" in _refusal(partial)


def test_every_refusal_is_said_at_once():
    bad = type("Bad", (Scratch,), {"letter": "c", "reference": "", "source": EARLIER})()
    refusal = _refusal(bad)
    assert "'concurrency' and 'scratch' share the letter 'c'" in refusal
    assert "'scratch' declares no reference model" in refusal
    assert "lua/scratch.lua does not define look, charge, refund" in refusal


def test_the_strategies_of_this_site_are_those_the_registry_loads():
    assert strategies.registry(strategies.STRATEGIES.values()) == strategies.STRATEGIES
