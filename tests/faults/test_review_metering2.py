"""A second hostile review of metered usage, on real parts: a proxied download (a file of unknown size) is
charged the bytes it sent, under the test client and gunicorn; an async stream the client leaves midway
under uvicorn is charged what it made, not all of it nor nothing; an overage cap of the wrong type is
refused where it is declared; Redis closing every connection between a request's admission and its end
counts its settle once; an import with a bad unit changes nothing."""

from __future__ import annotations

import csv
import io
import re
import socket
import time
import urllib.request

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory

import ratelimit_app
from ratelimit_app import closing, engine, portable, quotas
from ratelimit_app.decorators import ratelimit
from ratelimit_app.engine import giveback
from ratelimit_app.models import Policy, QuotaUsage
from ratelimit_app.portable import ImportRefused
from ratelimit_app.registry.declarations import check_declared_policies
from tests import servers
from tests.faults.test_connections import TIMEOUTS, use_server
from tests.faults.test_metering import counted, metered, settled_request
from tests.faults.test_review_giveback import _until
from tests.helpers import check, make_policy
from tests.servers import migrated_site
from tests.test_metering import used_now

pytestmark = pytest.mark.django_db
IP = "203.0.113.7"
SETTINGS = "tests.faults.review_metering2_settings"


def bytes_policy():
    return make_policy(name="download-bytes", action="download", limit=1_000_000, window=3600,
                       strategy="fixed_window", unit="content-bytes")


@pytest.mark.urls("tests.faults.review_metering2_site")
def test_a_proxied_download_of_unknown_size_is_charged_the_bytes_it_sent(server):
    """A FileResponse of a file with no size (an upstream's body) has no Content-Length: it was charged its
    estimate, 1 byte, for 70,000 sent."""
    bytes_policy()
    response = Client().get("/download/proxied/?size=70000", REMOTE_ADDR=IP)
    assert len(b"".join(response.streaming_content)) == 70_000
    response.close()
    assert used_now("download-bytes") == 70_000


@pytest.mark.parametrize("cap", [True, 2.5, "500"])
def test_an_overage_cap_that_is_not_a_whole_number_is_refused_where_it_is_declared(settings, cap):
    """True read as a cap of 1 token (2.5 as 2): every request's overage cut to 1, the bill with it, unsaid."""
    settings.RATELIMIT_POLICIES = [{"name": "llm", "action": "/llm/", "rate": "1000/m", "strategy": "fixed_window",
                                    "unit": "tokens", "overage_cap": cap}]
    [error] = check_declared_policies()
    assert "overage_cap" in error.msg and "not a whole number" in error.msg
    with pytest.raises(ImproperlyConfigured, match="overage_cap"):
        ratelimit(rate="1000/m", unit="tokens", overage_cap=cap)(lambda request: None)


def test_a_settle_after_redis_closed_every_connection_is_counted_once(settings, private):
    """Redis closes the app's connections (a restart of the proxy before it, CLIENT KILL, an idle timeout)
    between a request's admission and its end: its settle reaches the counter once, not never, not twice."""
    use_server(settings, private.url, timeouts=TIMEOUTS)
    compiled = metered()
    settled_request(300)  # admitted on the thread's kept connection, on an estimate of 10
    admin = redis.Redis(port=private.port)
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    closing.request_ended()  # its settle waits for the connection's next write
    engine.decide([check(compiled)], dry_run=True)
    assert counted(private.port, compiled) == 300
    time.sleep(1.2)  # past the carrying timer's second: nothing of it is sent again
    engine.decide([check(compiled)], dry_run=True)
    assert counted(private.port, compiled) == 300
    admin.close()


@pytest.mark.parametrize("unit", ["Tokens", "content_bytes", 5])
def test_an_import_with_a_bad_unit_changes_nothing(unit):
    make_policy(name="llm", action="/llm/", limit=1000, window=60, strategy="fixed_window", unit="tokens",
                overage_cap=7)
    before = list(Policy.objects.values())
    entries = [{"name": "other", "action": "/o/", "rate": "5/m"},
               {"name": "llm", "action": "/llm/", "rate": "20000/m", "unit": unit}]
    with pytest.raises(ImportRefused, match="unit"):
        portable.import_data({"format": "ratelimit_app/1", "policies": entries})
    assert list(Policy.objects.values()) == before


# --- on real servers --------------------------------------------------------------------------------

LIMIT = 10**9  # above the largest file: a header's remaining is never below 0
BYTES_POLICY = f"""
from ratelimit_app.models import Policy, QuotaUsage
Policy.objects.create(name="download-bytes", action="download", limit={LIMIT}, window=3600, strategy="fixed_window",
                      key="ip", unit="content-bytes")
"""


@pytest.fixture(scope="module")
def bytes_site(tmp_path_factory):
    return migrated_site(tmp_path_factory.mktemp("review_metering2"), SETTINGS, BYTES_POLICY)


def _charged(url: str) -> int:
    """The bytes charged so far, by the next request's header (less its own estimate, 1 byte, which its
    settle gives back: it is a download of no bytes)."""
    found = re.search(r'"download-bytes";r=(\d+)', servers.fetch(url)[1]["RateLimit"])
    return LIMIT - int(found.group(1)) - 1


def _read_then_leave(port: int, path: str, size: int) -> int:
    """A client that reads about `size` bytes of the answer, then closes its connection; what it read."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        read = b""
        while len(read) < size:
            read += client.recv(size)
    return len(read)


FILE_SIZE = 64 * 2**20  # more than loopback's socket buffers hold: a client that leaves stops the sending


@pytest.fixture(scope="module")
def gunicorn(bytes_site, tmp_path_factory):
    large = tmp_path_factory.mktemp("review_metering2_file") / "large.bin"
    with open(large, "wb") as file:
        file.truncate(FILE_SIZE)  # sparse: no time spent writing it
    with servers.serving(bytes_site, SETTINGS, workers=1, REVIEW_METERING_FILE=str(large)) as server:
        yield server


@pytest.mark.slow
def test_a_proxied_download_under_gunicorn_is_charged_the_bytes_it_sent(gunicorn, redis_client):
    """gunicorn sends a file through its file wrapper: one of unknown size was charged its estimate."""
    redis_client.flushdb()
    with urllib.request.urlopen(gunicorn.url + "/download/proxied/?size=70000", timeout=20) as answer:
        assert len(answer.read()) == 70_000
    look = gunicorn.url + "/download/proxied/?size=0"
    assert _until(lambda: _charged(look) == 70_000), _charged(look)  # a look sends none


@pytest.mark.slow
def test_a_large_file_the_client_leaves_midway_under_gunicorn_is_charged_what_was_sent(gunicorn, redis_client):
    """Charged by its Content-Length, a client that read 100 kB of a 64 MB file was billed all 64 MB."""
    redis_client.flushdb()
    read = _read_then_leave(gunicorn.port, "/download/file/", 100_000)
    look = gunicorn.url + "/download/proxied/?size=0"
    assert _until(lambda: read - 1000 <= _charged(look) <= FILE_SIZE // 4), (read, _charged(look))


@pytest.mark.slow
def test_an_async_stream_the_client_leaves_is_charged_what_was_made_under_uvicorn(bytes_site, redis_client):
    """uvicorn tells Django the client left; Django cancels the view's stream: its bytes made so far are
    charged, neither the whole answer (100,000) nor only its estimate."""
    redis_client.flushdb()
    with servers.serving(bytes_site, SETTINGS, asgi=True) as server:
        read = _read_then_leave(server.port, "/download/slow/?chunks=100", 3000)
        size_zero = server.url + "/download/proxied/?size=0"
        # what it read: the chunks made before it left, with the headers and the chunks' framing
        assert _until(lambda: read - 600 <= _charged(size_zero) <= 20_000, 10)
        time.sleep(1.5)  # the looks' own bytes given back have landed (within a second)
        charged = _charged(size_zero)
        assert read - 600 <= charged <= 20_000
        time.sleep(1.5)
        assert _charged(size_zero) == charged  # it stopped



@pytest.mark.urls("tests.metering_urls")
def test_a_streamed_download_compressed_inside_the_limiter_is_charged_the_bytes_sent(settings, server):
    """What the guide says to do for compressed streams: GZipMiddleware listed after the limiter's."""
    at = settings.MIDDLEWARE.index("ratelimit_app.middleware.RateLimitMiddleware") + 1
    settings.MIDDLEWARE = [*settings.MIDDLEWARE[:at], "django.middleware.gzip.GZipMiddleware", *settings.MIDDLEWARE[at:]]
    bytes_policy()
    response = Client().get("/download/streamed/?size=5000", REMOTE_ADDR=IP, HTTP_ACCEPT_ENCODING="gzip")
    sent = len(b"".join(response.streaming_content))
    response.close()
    # compressed: what was sent is not the body's 10,000 bytes (fewer; more where Django flushes each chunk, 6.1)
    assert response["Content-Encoding"] == "gzip" and sent != 10_000
    assert used_now("download-bytes") == sent


@pytest.mark.xfail(strict=True, reason=(
    "a streamed body is counted where it leaves the limiter's door, before an outer GZipMiddleware compresses "
    "it (a whole answer is counted once the server closes it, compressed); counting what the server really "
    "iterates needs the body an outer middleware sets to be wrapped again (Django's private "
    "_set_streaming_content); the guide asks for GZipMiddleware inside the limiter's middleware instead"))
@pytest.mark.urls("tests.metering_urls")
def test_a_streamed_download_compressed_by_an_outer_gzip_is_charged_the_bytes_sent(settings, server):
    """As a whole download is (the first review's test): 56 compressed bytes sent, 10,000 charged."""
    settings.MIDDLEWARE = ["django.middleware.gzip.GZipMiddleware", *settings.MIDDLEWARE]
    bytes_policy()
    response = Client().get("/download/streamed/?size=5000", REMOTE_ADDR=IP, HTTP_ACCEPT_ENCODING="gzip")
    sent = len(b"".join(response.streaming_content))
    response.close()
    assert response["Content-Encoding"] == "gzip"
    assert used_now("download-bytes") == sent



def _started() -> RequestFactory:
    """A request of the caller, started as a handler starts one (its end is the test's)."""
    request = RequestFactory().get("/", REMOTE_ADDR=IP)
    closing.request_began(environ=request.environ)
    return request


def test_a_caller_refused_while_a_request_was_in_flight_is_admitted_once_it_settled_below_its_estimate(server):
    """1,000 tokens an hour; a request admitted on an estimate of 600 is in flight, so a second of 600 is
    refused. The first used 50: 950 are left, yet the worker went on refusing from memory for the rest of
    the hour (730 s in one run) while Redis would admit."""
    make_policy(name="llm-tokens", action="llm", limit=1000, window=3600, strategy="fixed_window", unit="tokens")
    first = _started()
    assert ratelimit_app.hit(first, "llm", cost=600).allowed
    first_closing = closing.current.get()
    assert not ratelimit_app.hit(_started(), "llm", cost=600).allowed
    closing.request_ended()
    ratelimit_app.settle(first, tokens=50)
    first_closing.send()  # the first request ends
    giveback.carried.send()
    assert used_now("llm-tokens") == 50
    third = _started()
    verdict = ratelimit_app.hit(third, "llm", cost=600)
    closing.request_ended()
    assert verdict.allowed



def _monthly_tokens() -> None:
    make_policy(name="llm-month", action="llm", limit=1_000_000, window=31 * 86400, strategy="calendar_quota",
                period="month", time_zone="UTC", unit="tokens")


def _switched_to_100_requests_counts_one() -> None:
    """The quota edited to count 100 requests a month; its next request is its first."""
    row = Policy.objects.get(name="llm-month")
    row.unit, row.limit = "requests", 100
    row.full_clean()
    row.save()
    verdict = ratelimit_app.hit(_started(), "llm", cost=1)
    closing.request_ended()
    assert verdict.allowed and verdict.decisions[0].count == 1


def test_a_monthly_quota_switched_from_tokens_to_requests_counts_requests_afresh(server, admin_client):
    """The first review proved it for windows and buckets; a calendar quota seeds a counter Redis does not
    have from the usage saved for the period: 900,000 tokens became 900,000 requests of 100, refused all month.
    The period's usage in each unit is a row of its own, billed in its unit."""
    _monthly_tokens()
    first = _started()
    assert ratelimit_app.hit(first, "llm", cost=10).allowed
    ratelimit_app.settle(first, tokens=900_000)
    closing.request_ended()
    giveback.carried.send()
    quotas.saver.save()
    assert QuotaUsage.objects.get().used == 900_000
    _switched_to_100_requests_counts_one()
    quotas.saver.save()
    assert sorted(QuotaUsage.objects.values_list("unit", "used")) == [("requests", 1), ("tokens", 900_000)]
    export = admin_client.get("/admin/ratelimit_app/quotausage/export.csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))
    assert sorted((row["unit"], row["used"]) for row in rows) == [("requests", "1"), ("tokens", "900000")]
    listed = admin_client.get("/admin/ratelimit_app/quotausage/").content.decode()
    assert sorted(re.findall(r'<td class="field-unit">(\w+)</td>', listed)) == ["requests", "tokens"]


def test_a_monthly_quota_switched_before_its_tokens_were_saved_counts_requests_afresh(server):
    """The saver's usage waiting for its next save is read as the database's is: a switch within seconds of
    the last tokens counted must not seed the requests counter with them either."""
    _monthly_tokens()
    assert ratelimit_app.hit(_started(), "llm", cost=500).allowed
    closing.request_ended()
    _switched_to_100_requests_counts_one()
