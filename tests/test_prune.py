"""Old Functions libraries: every deploy that changes the Lua adds a library to Redis; `manage.py
ratelimit prune` deletes those no worker runs (each worker says which it runs, in a short-lived key),
never this version's, and a worker whose library went anyway loads it again and counts once.

These tests load and delete libraries, so they run against a Redis of their own."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from project.devredis import PrivateRedis
from ratelimit_app import engine
from ratelimit_app.engine.scripts import HEARTBEAT_MS, library_key, scripts
from ratelimit_app.engine.tally import tally
from tests.helpers import check, policy

pytestmark = pytest.mark.django_db


@pytest.fixture
def server(settings):
    private = PrivateRedis().start()
    settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": private.url}}
    settings.RATELIMIT_CACHE = "own"
    yield private
    private.stop()


def load_version(name: str) -> None:
    """Load the library of another version of the app (the same code under another name, as a
    changed source would have), as one of its workers would."""
    engine.client().execute_command("FUNCTION LOAD", scripts.library.replace(scripts.library_name, name))


def libraries() -> set[str]:
    return {entry[1].decode() for entry in engine.client().execute_command("FUNCTION LIST")}


def prune() -> str:
    out = StringIO()
    call_command("ratelimit", "prune", stdout=out)
    return out.getvalue()


def test_prune_deletes_the_libraries_no_worker_runs_and_keeps_those_in_use(server):
    limited = policy(limit=5)
    assert engine.decide([check(limited)]).allowed  # this version's library is loaded by its first call
    load_version("ratelimit_000000000001")  # a version whose workers are gone
    load_version("ratelimit_000000000002")  # a version still running during a rolling deploy
    engine.client().set(library_key("ratelimit_000000000002"), "1", px=HEARTBEAT_MS)
    output = prune()
    assert libraries() == {scripts.library_name, "ratelimit_000000000002"}
    assert "Deleted ratelimit_000000000001" in output and "Kept ratelimit_000000000002" in output
    assert engine.decide([check(limited)]).decisions[0].count == 2  # nothing this version runs was touched


@pytest.mark.parametrize(
    "word", ["other-site:library:ratelimit_000000000002", "ratelimit-library:ratelimit_000000000002"],
    ids=["another-site's-prefix", "the-previous-version's-shape"])
def test_prune_keeps_a_library_a_worker_of_another_site_or_of_the_previous_version_runs(server, word):
    """Each site says it runs a library under its own key prefix; a prune reads every site's word, and
    the words of the version before this one (ratelimit-library:<name>, during a rolling deploy)."""
    assert engine.decide([check(policy())]).allowed
    load_version("ratelimit_000000000001")
    load_version("ratelimit_000000000002")
    engine.client().set(word, "1", px=HEARTBEAT_MS)
    output = prune()
    assert libraries() == {scripts.library_name, "ratelimit_000000000002"}
    assert "Deleted ratelimit_000000000001" in output and "Kept ratelimit_000000000002" in output


def test_prune_never_deletes_its_own_library_even_when_no_worker_said_it_runs_it(server):
    assert engine.decide([check(policy())]).allowed
    engine.client().delete(library_key(scripts.library_name))
    prune()
    assert libraries() == {scripts.library_name}


def test_a_worker_whose_library_was_pruned_by_another_version_loads_it_again_and_counts_once(server):
    limited = policy(limit=5)
    for _ in range(2):
        assert engine.decide([check(limited)]).allowed
    engine.client().execute_command("FUNCTION DELETE", scripts.library_name)  # another version's prune
    assert [engine.decide([check(limited)]).decisions[0].count for _ in range(3)] == [3, 4, 5]
    assert scripts.library_name in libraries()


def test_a_worker_in_use_says_which_library_it_runs_for_a_short_while(server):
    tally._heartbeat_due = 0.0  # as a fresh worker
    assert engine.decide([check(policy())]).allowed
    tally.flush()
    ttl = engine.client().pttl(library_key(scripts.library_name))
    assert 0 < ttl <= HEARTBEAT_MS


def test_prune_on_a_server_without_functions_says_so(settings):
    private = PrivateRedis(options=("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")).start()
    try:
        settings.CACHES = {**settings.CACHES, "own": {**settings.CACHES["default"], "LOCATION": private.url}}
        settings.RATELIMIT_CACHE = "own"
        assert "No library of this app" in prune()
    finally:
        private.stop()
