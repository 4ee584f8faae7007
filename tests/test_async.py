"""Async views and the async middleware: the same policies, one call through redis-py's asyncio
client, exact under concurrency (the demo under uvicorn)."""

from __future__ import annotations

import concurrent.futures
import urllib.request

import pytest
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.db import connections
from django.test import AsyncClient, RequestFactory

import ratelimit_app
from ratelimit_app.middleware import RateLimitMiddleware
from ratelimit_app.engine.tally import tally
from tests.helpers import make_policy
from tests.servers import Server, fetch, manage, site_env

IP = "203.0.113.7"


def evalsha_calls(redis_client) -> int:
    stats = redis_client.info("commandstats")
    return sum(stats.get(name, {}).get("calls", 0) for name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))


class ClientAt(AsyncClient):
    """An async test client whose requests come from `address` (ASGI takes REMOTE_ADDR from the scope)."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def _base_scope(self, **request):
        return {**super()._base_scope(**request), "client": [self.address, 0]}


def client_at(address: str) -> AsyncClient:
    return ClientAt(address)


@pytest.fixture
def aclient():
    return client_at(IP)


@pytest.fixture(autouse=True)
async def _worker_thread_connections_closed():
    """Async views read the database in asgiref's one worker thread, whose connection would outlive
    the test (PostgreSQL then refuses to drop the test database at the end of the run)."""
    yield
    await sync_to_async(connections.close_all)()


def test_the_middleware_runs_async_on_an_async_stack():
    async def view(request):  # pragma: no cover - never called
        return None

    assert iscoroutinefunction(RateLimitMiddleware(view))  # Django then adds no thread hop around it


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/demo/quote/", "/demo/quote/class/"])
async def test_async_views_under_the_decorator_are_limited_not_broken(aclient, path):
    await make_apolicy(name="quote-per-ip", action="quote", limit=2, key="ip")
    statuses = [(await aclient.get(path)).status_code for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    allowed = await client_at("198.51.100.1").get(path)
    assert allowed.headers["RateLimit"].startswith('"quote-per-ip";r=1;')  # another client has its own quota


@pytest.mark.django_db(transaction=True)
async def test_one_redis_call_per_async_request_whatever_doors_see_it(aclient, redis_client):
    await make_apolicy(name="everywhere", action="*", limit=100, key="ip")
    await make_apolicy(name="quote-per-ip", action="quote", limit=100, key="ip")
    await aclient.get("/demo/quote/")  # loads the policy index
    with tally._flushing:  # the totals' background flush, a script call of its own, waits
        before = evalsha_calls(redis_client)
        await aclient.get("/demo/quote/")
        await aclient.get("/demo/search/?q=a")
        assert evalsha_calls(redis_client) - before == 2


@pytest.mark.django_db(transaction=True)
async def test_refused_async_requests_use_up_no_quota(aclient):
    await make_apolicy(name="everywhere", action="*", limit=100, key="ip")
    await make_apolicy(name="quote-per-ip", action="quote", limit=1, key="ip")
    assert [(await aclient.get("/demo/quote/")).status_code for _ in range(3)] == [200, 429, 429]
    headers = (await aclient.get("/demo/search/?q=a")).headers["RateLimit"]
    assert '"everywhere";r=98;' in headers  # the quote and this search: the refusals were not counted


@pytest.mark.django_db(transaction=True)
async def test_acheck_counts_nothing_and_ahit_counts():
    await make_apolicy(name="export", action="export", limit=1, key="ip")
    request = RequestFactory().get("/", REMOTE_ADDR=IP)
    assert (await ratelimit_app.acheck(request, "export")).allowed
    assert (await ratelimit_app.ahit(request, "export")).allowed
    again = RequestFactory().get("/", REMOTE_ADDR=IP)
    assert not (await ratelimit_app.acheck(again, "export")).allowed
    assert not (await ratelimit_app.ahit(again, "export")).allowed


async def make_apolicy(**fields):
    from asgiref.sync import sync_to_async

    return await sync_to_async(make_policy)(**fields)


@pytest.mark.slow
def test_demo_under_uvicorn_admits_exactly_the_limit_to_concurrent_clients(tmp_path):
    env = site_env(tmp_path / "site.sqlite3")
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", "from ratelimit_app.models import Policy\n"
           "Policy.objects.create(name='quote', action='quote', limit=50, window=3600, strategy='sliding_log', key='ip')")
    server = Server(env, asgi=True)
    try:
        fetch(server.url + "/")  # the worker has loaded its index

        def attempts(_):
            codes = []
            for _ in range(25):
                try:
                    with urllib.request.urlopen(server.url + "/demo/quote/", timeout=10) as response:
                        codes.append(response.status)
                except urllib.error.HTTPError as error:
                    codes.append(error.code)
            return codes

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = sum(pool.map(attempts, range(8)), [])
    finally:
        server.stop()
    assert codes.count(200) == 50
    assert codes.count(429) == 150
