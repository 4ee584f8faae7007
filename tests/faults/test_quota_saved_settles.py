"""The quota saver's read of the counters it saves, through faults at that moment: Redis not answering (stopped)
saves the counts last seen and reads the true ones at the next save; the database away keeps them for later.
Either way the saved usage ends equal to the counter: nothing lost, nothing counted twice, and no request
answers a 500 (the read is the saver's, off the requests' way)."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
from django.test import Client

from ratelimit_app import quotas
from ratelimit_app.engine.giveback import carried
from ratelimit_app.models import QuotaUsage
from tests.faults.test_connections import use_server
from tests.faults.test_review_saver import database_unreachable
from tests.test_quota_saved_settles import IP, counted, quota

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.metering_urls")]


def three_requests_settling_2_tokens_of_10() -> None:
    for _ in range(3):
        assert Client().get("/llm/?used=2", REMOTE_ADDR=IP).status_code == 200
    carried.send()


def test_a_save_redis_does_not_answer_keeps_what_was_seen_then_saves_the_counter(settings, private, caplog):
    use_server(settings, private.url)
    compiled = quota()
    three_requests_settling_2_tokens_of_10()
    assert counted(compiled) == 6
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    os.kill(private.process.pid, signal.SIGSTOP)
    try:
        assert quotas.saver.save() == 1
    finally:
        os.kill(private.process.pid, signal.SIGCONT)
    assert any("could not be read to save them" in record.getMessage() for record in caplog.records)
    assert QuotaUsage.objects.get().used == 14  # the last decision's count (2 + 2 + its estimate): not lost
    assert quotas.saver.save() == 1  # read again now that Redis answers
    assert QuotaUsage.objects.get().used == counted(compiled) == 6
    quotas.saver.save()  # a settle heard of just now is read once more: the same count, never added
    assert QuotaUsage.objects.get().used == 6


def test_a_save_the_database_refuses_is_saved_once_it_answers_with_the_counter(settings, tmp_path, caplog):
    compiled = quota()
    three_requests_settling_2_tokens_of_10()
    caplog.set_level(logging.WARNING, logger="ratelimit_app")
    with database_unreachable(tmp_path):
        saving = threading.Thread(target=quotas.saver._timed)  # a new connection: the database is away for it
        saving.start()
        saving.join()
    assert any("quota usage could not be saved yet" in record.getMessage() for record in caplog.records)
    assert not QuotaUsage.objects.exists()
    assert quotas.saver.save() == 1
    assert QuotaUsage.objects.get().used == counted(compiled) == 6  # the counter, once: not 12, not the estimates
    for _ in range(2):
        quotas.saver.save()  # what a settle may yet move is read again: the same count, never added
    assert QuotaUsage.objects.get().used == 6
