"""The how-to "Metering tokens for a language-model API", run as written: its import file, its fake model,
its DRF views (a whole answer and a streamed one), its usage page and its invoice script are read from the
Markdown, code block by code block, into a `mysite` package, and a customer of each plan uses the API."""

from __future__ import annotations

import contextlib
import csv
import io
import re
import sys
import time
import types

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.urls import clear_url_caches, path
from rest_framework.test import APIClient

import ratelimit_app
from ratelimit_app import quotas
from ratelimit_app.models import Policy, QuotaUsage
from ratelimit_app.periods import periods_at, zone
from ratelimit_app.quotas import as_datetime
from tests.servers import ROOT
from tests.helpers import closed

pytestmark = pytest.mark.django_db
GUIDE = ROOT / "docs" / "howto" / "metering-tokens.md"
FREE, PRO = "sk-free-0001", "sk-pro-0001"
PROMPT = "tell me about the quick brown fox please"  # 8 tokens to the fake model


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), re.S)


def block(label: str) -> str:
    """The python block whose first line is `# <label>`, as the reader pastes it."""
    (found,) = [text for text in blocks("python") if text.splitlines()[0] == f"# {label}"]
    return found


def shown(field: str) -> str:
    """A header line the guide shows a response with."""
    return re.search(rf"^{field}: (.*)$", GUIDE.read_text(), re.M).group(1)


@pytest.fixture
def mysite(monkeypatch, settings, tmp_path):
    """The guide's modules as a `mysite` package, its URLconf the site's."""
    package = types.ModuleType("mysite")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "mysite", package)
    for name in ("llm", "views", "usage", "urls"):
        module = types.ModuleType(f"mysite.{name}")
        monkeypatch.setitem(sys.modules, module.__name__, module)
        setattr(package, name, module)
        if name == "urls":  # what startproject's urls.py holds before the guide's lines are added
            module.__dict__.update(path=path, urlpatterns=[path("admin/", admin.site.urls)])
        exec(compile(block(f"mysite/{name}.py"), f"{GUIDE.name}: mysite/{name}.py", "exec"), module.__dict__)
    package.urls.urlpatterns.append(path("v1/usage/", package.usage.my_usage))
    settings.ROOT_URLCONF = "mysite.urls"
    clear_url_caches()
    (policies,) = [text for text in blocks("json") if '"format": "ratelimit_app/1"' in text]
    command = re.search(r"`python manage\.py (ratelimit_import) (plans\.json)`", GUIDE.read_text())
    (tmp_path / command[2]).write_text(policies)
    call_command(command[1], str(tmp_path / command[2]), stdout=io.StringIO())
    yield package
    clear_url_caches()


def customer(key: str) -> APIClient:
    return APIClient(REMOTE_ADDR="203.0.113.7", HTTP_X_API_KEY=key)


def headers_of(field: str) -> str:
    return re.sub(r"t=\d+", "t=N", re.sub(r"w=\d{6,}", "w=PERIOD", field))


def used(client: APIClient) -> dict[str, str]:
    answer = client.get("/v1/usage/").json()
    return {item["policy"]: text for item, text in zip(answer["limits"], answer["text"])}


def test_a_chat_is_admitted_on_its_estimate_and_charged_what_it_used(mysite):
    free = customer(FREE)
    answer = free.post("/v1/chat/", {"prompt": PROMPT}, format="json")
    assert answer.status_code == 200
    total = answer.json()["usage"]["total_tokens"]
    assert total == 8 + 24  # the prompt, and an answer three times as long
    # the headers leave before the settle: what was left once the estimate (8 + 1000) was taken
    assert headers_of(answer["RateLimit-Policy"]) == headers_of(shown("RateLimit-Policy"))
    assert headers_of(answer["RateLimit"]) == headers_of(shown("RateLimit"))
    assert used(free) == {
        "chat-tokens-per-minute": "32 / 20,000 tokens per 1 min",
        "chat-tokens-per-month": "32 / 1,000,000 tokens this month",
    }
    # the next response counts the first as settled (32), and its own estimate (8 + 10)
    assert "r=19950;" in free.post("/v1/chat/", {"prompt": PROMPT, "max_tokens": 10}, format="json")["RateLimit"]


def test_a_streamed_answer_settles_on_its_last_chunk(mysite):
    free = customer(FREE)
    answer = free.post("/v1/chat/stream/", {"prompt": PROMPT, "max_tokens": 5}, format="json")
    assert b"".join(answer.streaming_content).decode() == "the quick brown fox jumps "
    closed(answer)
    assert used(free)["chat-tokens-per-month"] == "13 / 1,000,000 tokens this month"


def test_a_streamed_answer_the_client_stops_reading_settles_what_it_was_sent(mysite):
    free = customer(FREE)
    answer = free.post("/v1/chat/stream/", {"prompt": PROMPT, "max_tokens": 50}, format="json")
    chunks = iter(answer.streaming_content)
    assert [next(chunks) for _ in range(3)] == [b"the ", b"quick ", b"brown "]
    closed(answer)  # the client went away: the server closes the body
    assert used(free)["chat-tokens-per-month"] == "11 / 1,000,000 tokens this month"  # 8 + the 3 it was sent


def test_a_chat_whose_estimate_does_not_fit_is_refused_before_the_model_runs_in_words_of_tokens(mysite):
    from ratelimit_app import engine
    from ratelimit_app.policies import compile_policy
    from ratelimit_app.values import Check, Subject

    minute = compile_policy(Policy.objects.get(name="chat-tokens-per-minute"))
    subject = Subject(ratelimit_app.subject_key(minute.name, f"header:X-Api-Key={FREE}"), "header:x-api-key=…")
    assert engine.decide([Check(minute, subject, minute.limit)], cost=19_500).allowed  # the minute nearly used
    refused = customer(FREE).post("/v1/chat/", {"prompt": PROMPT}, format="json")
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith(
        "Too many requests: the limit of 20,000 tokens per 60 s of policy 'chat-tokens-per-minute' is reached. "
        "This request is estimated at 1,008 tokens. Retry in "
    )
    never = customer(FREE).post("/v1/chat/", {"prompt": "word " * 19_500}, format="json")
    assert never.json()["detail"] == (
        "Too many requests: this request is estimated at 20,500 tokens, more than policy 'chat-tokens-per-minute' "
        "allows at once (20,000 tokens); it can never be admitted."
    )


def test_a_request_the_view_refuses_costs_what_its_estimate_could_read(mysite):
    free = customer(FREE)
    assert free.post("/v1/chat/", {"prompt": PROMPT, "max_tokens": 0}, format="json").status_code == 400
    assert used(free)["chat-tokens-per-month"] == "1 / 1,000,000 tokens this month"


def test_a_pro_key_meets_its_plans_limits_in_tokens(mysite):
    pro = customer(PRO)
    answer = pro.post("/v1/chat/", {"prompt": PROMPT}, format="json")
    assert '"chat-tokens-per-month";q=10000000;' in answer["RateLimit-Policy"]
    assert '"chat-tokens-per-minute";q=200000;' in answer["RateLimit-Policy"]
    assert used(pro)["chat-tokens-per-month"] == "32 / 10,000,000 tokens this month"


def export_and_invoice(admin_client, tmp_path, monkeypatch) -> tuple[list[tuple], str]:
    """The guide's invoice of the usage export: what invoice() returns, and what the script prints."""
    export = admin_client.get("/admin/ratelimit_app/quotausage/export.csv")
    csv_file = tmp_path / "quota-usage.csv"
    csv_file.write_bytes(b"".join(export.streaming_content))
    script = compile(block("invoice.py"), f"{GUIDE.name}: invoice.py", "exec")
    invoice: dict = {}
    exec(script, invoice)
    with csv_file.open(newline="") as rows:
        billed = sorted(invoice["invoice"](csv.DictReader(rows)))
    printed = io.StringIO()
    monkeypatch.setattr(sys, "argv", ["invoice.py", str(csv_file)])
    with contextlib.redirect_stdout(printed):
        exec(script, {"__name__": "__main__"})
    return billed, printed.getvalue()


def key_of(api_key: str) -> str:
    return ratelimit_app.subject_key("chat-tokens-per-month", f"header:X-Api-Key={api_key}")


def test_the_invoice_prices_what_each_plan_includes_and_what_went_beyond_it(mysite, admin_client, tmp_path,
                                                                           monkeypatch):
    month = Policy.objects.get(name="chat-tokens-per-month")
    start = as_datetime(periods_at("month", zone("UTC"), int(time.time() * 1000)).previous)
    for api_key, used_tokens, limit in ((PRO, 12_500_000, 10_000_000), (FREE, 420_000, 1_000_000)):
        QuotaUsage.objects.create(policy=month, subject=key_of(api_key), display="header:x-api-key=…",
                                  period_start=start, unit=month.unit, used=used_tokens, limit=limit)
    billed, printed = export_and_invoice(admin_client, tmp_path, monkeypatch)
    # pro: 49.00 for the plan and 2.5 million tokens beyond it at 8.00 a million
    assert billed == sorted([(key_of(PRO), "pro", 12_500_000, 69.0), (key_of(FREE), "free", 420_000, 0.0)])
    assert f"{key_of(PRO)}  pro       12,500,000 tokens     69.00" in printed


def test_the_saved_usage_exceeds_what_was_settled_by_the_last_requests_estimate_at_most(mysite):
    """The guide's warning, as a bound: two chats of 32 tokens, each admitted on 1,008."""
    free = customer(FREE)
    for _ in range(2):
        assert free.post("/v1/chat/", {"prompt": PROMPT}, format="json").status_code == 200
    assert used(free)["chat-tokens-per-month"] == "64 / 1,000,000 tokens this month"  # Redis: exact
    quotas.saver.save()
    saved = QuotaUsage.objects.get(policy__name="chat-tokens-per-month", subject=key_of(FREE)).used
    assert 64 <= saved <= 64 + (1008 - 32)


def test_the_usage_export_bills_what_requests_settled_not_their_estimates(mysite, admin_client, tmp_path,
                                                                         monkeypatch):
    customer(PRO).post("/v1/chat/", {"prompt": PROMPT}, format="json")
    closed(customer(FREE).post("/v1/chat/stream/", {"prompt": PROMPT, "max_tokens": 5}, format="json"))
    quotas.saver.save()
    billed, _printed = export_and_invoice(admin_client, tmp_path, monkeypatch)
    assert billed == sorted([(key_of(PRO), "pro", 32, 49.0), (key_of(FREE), "free", 13, 0.0)])
