"""A request's route through the package stays short: few modules, few climbs back to a module it left."""

from __future__ import annotations

import sys
from typing import Callable, Iterable

import pytest
from django.conf import settings as django_settings
from django.test import RequestFactory

from ratelimit_app.middleware import RateLimitMiddleware
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db

MODULES, CLIMBS = 9, 8  # every route's budget: a change that lengthens one says why, here
# The bottom layer (.importlinter) imports nothing of the package: a call into it leads nowhere else
VOCABULARY = frozenset({"values", "conf", "rates", "lru", "headers", "periods", "drivers"})
ENGINE = "engine"  # the Redis side, entered through decide(): what it calls is its own business


def unit(module: str) -> str:
    """The unit a module of the package counts as: itself, or its subpackage (subjects.specs: subjects)."""
    return module.split(".")[1] if "." in module else "__init__"


def walk(run: Callable[[], object], entry=RateLimitMiddleware.__call__) -> tuple[list[str], list[str]]:
    """The package's modules `run` runs in from a call of `entry` to its return: (route, every_call).

    `every_call`: the module of each new Python frame in order (a generator resumed is no new frame),
    repeats in a row merged. `route`: the same by unit, without the vocabulary and the engine's insides."""
    calls: list[tuple[str, bool]] = []  # (module, called from inside the engine)
    frames: list = []  # every frame seen, kept so that no new one reuses an id
    seen: set[int] = set()
    depth = 0  # frames of `entry` on the stack: recording while > 0

    def profile(frame, event, arg):
        nonlocal depth
        if frame.f_code is entry.__code__ and event in ("call", "return"):
            depth += 1 if event == "call" else -1
        if depth <= 0 or event != "call" or id(frame) in seen:
            return
        seen.add(id(frame))
        frames.append(frame)
        module = frame.f_globals.get("__name__", "")
        if module.startswith("ratelimit_app."):
            calls.append((module, _inside(frame.f_back, entry.__code__)))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        frames.clear()
    every_call = _merged(module.removeprefix("ratelimit_app.") for module, _ in calls)
    route = _merged(unit(m) for m, inside_engine in calls if not inside_engine and unit(m) not in VOCABULARY)
    return route, every_call


def _inside(frame, entry_code) -> bool:
    """Whether `frame` is the engine's or runs below one of its frames."""
    while frame is not None and frame.f_code is not entry_code:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("ratelimit_app.") and unit(name) == ENGINE:
            return True
        frame = frame.f_back
    return False


def _merged(modules: Iterable[str]) -> list[str]:
    merged: list[str] = []
    for module in modules:
        if not merged or merged[-1] != module:
            merged.append(module)
    return merged


def climbs(route: list[str]) -> int:
    """How many times the route comes back to a module it had left for another."""
    seen: set[str] = set()
    back = 0
    for module in route:
        back += module in seen
        seen.add(module)
    return back


def figures(route: list[str]) -> str:
    return f"{len(set(route))} modules, {climbs(route)} climbs: {' > '.join(route)}"


def test_a_request_through_the_middleware_visits_few_modules(client):
    make_policy(name="search-per-ip", action="demo:search", limit=100)
    client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7")  # the index is loaded; the clients connect
    route, every_call = walk(lambda: client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7"))
    print(f"\nroute: {figures(route)}\nevery call: {figures(every_call)}")
    assert {"middleware", "engine"} <= set(route)  # the policy applied: Redis was asked
    assert len(set(route)) <= MODULES and climbs(route) <= CLIMBS, figures(route)


# A quota's first request of a period asks Redis twice (the counter is absent: the saved usage is read and
# the call made again); the engine does that through its hooks, so the route is a window's.
def test_a_quotas_first_request_of_a_period_visits_few_modules(client):
    from ratelimit_app import quotas
    from ratelimit_app.models import QuotaUsage

    make_policy(name="search-monthly", action="demo:search", limit=100, strategy="calendar_quota", period="month")
    client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.8")  # the index is loaded; the clients connect
    quotas.saver.save()
    route, every_call = walk(lambda: client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7"))
    print(f"\nroute: {figures(route)}\nevery call: {figures(every_call)}")
    assert "quotas" in every_call  # its first of the period: the saved usage was read
    assert {"middleware", "engine"} <= set(route)
    assert len(set(route)) <= MODULES and climbs(route) <= CLIMBS, figures(route)
    quotas.saver.save()
    assert QuotaUsage.objects.get(display="ip:203.0.113.7").used == 1  # and what it counted was saved



# a subject on a plan: its limit is the plan's, resolved beside its subject
def test_a_request_on_a_plan_visits_few_modules(client):
    from ratelimit_app.models import Plan, PlanAssignment, PlanLimit

    search = make_policy(name="search-per-ip", action="demo:search", limit=3)
    pro = Plan.objects.create(name="pro")
    PlanLimit.objects.create(plan=pro, policy=search, limit=10)
    PlanAssignment.objects.create(plan=pro, kind="ip", network="203.0.113.0/24")
    client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7")
    route, every_call = walk(lambda: client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7"))
    print(f"\nroute: {figures(route)}\nevery call: {figures(every_call)}")
    assert {"middleware", "engine"} <= set(route)
    assert len(set(route)) <= MODULES and climbs(route) <= CLIMBS, figures(route)
    # the plan's limit was in effect: a 5th request within the minute passes, the policy's own 3 would refuse it
    assert [client.get("/demo/search/?q=a", REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)] == [200] * 3


# --- the other doors: each alone (no middleware in front), from the door's own entry ---------------------

WITHOUT_MIDDLEWARE = [m for m in django_settings.MIDDLEWARE if not m.startswith("ratelimit_app")]


def test_a_request_through_ratelimit_alone_visits_few_modules(client, settings):
    from project.demo import views

    settings.MIDDLEWARE = WITHOUT_MIDDLEWARE
    make_policy(name="login-per-ip", action="login", limit=100)
    client.get("/demo/login/", REMOTE_ADDR="203.0.113.7")
    route, every_call = walk(lambda: client.get("/demo/login/", REMOTE_ADDR="203.0.113.7"),
                             entry=views.login.__wrapped__)  # @ratelimit's, inside require_http_methods
    print(f"\nroute: {figures(route)}\nevery call: {figures(every_call)}")
    assert {"decorators", "engine"} <= set(route)
    assert len(set(route)) <= MODULES and climbs(route) <= CLIMBS, figures(route)


def test_a_request_through_the_drf_throttle_alone_visits_few_modules(client, settings):
    from ratelimit_app.throttling import PolicyThrottle

    settings.MIDDLEWARE = WITHOUT_MIDDLEWARE
    make_policy(name="items-per-ip", action="items", limit=100)
    client.get("/api/items/", REMOTE_ADDR="203.0.113.7")
    route, every_call = walk(lambda: client.get("/api/items/", REMOTE_ADDR="203.0.113.7"),
                             entry=PolicyThrottle.allow_request)
    print(f"\nroute: {figures(route)}\nevery call: {figures(every_call)}")
    assert {"throttling", "engine"} <= set(route)
    assert len(set(route)) <= MODULES and climbs(route) <= CLIMBS, figures(route)


def test_a_hit_visits_few_modules():
    import ratelimit_app

    make_policy(name="upload-per-ip", action="upload", limit=100)
    ratelimit_app.hit(RequestFactory().get("/", REMOTE_ADDR="203.0.113.7"), "upload")
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.7")
    route, every_call = walk(lambda: ratelimit_app.hit(request, "upload"), entry=ratelimit_app.hit)
    print(f"\nroute: {figures(route)}\nevery call: {figures(every_call)}")
    assert "engine" in route
    assert len(set(route)) <= MODULES and climbs(route) <= CLIMBS, figures(route)


# Two doors on one route: the middleware matches the route and leaves the call to @ratelimit or the DRF
# throttle, which gathers its names and makes it; both doors' modules are on the route, and each enters
# the sequence (doors) and the request's state (limiter) once.
TWO_DOORS_MODULES, TWO_DOORS_CLIMBS = 10, 12


@pytest.mark.parametrize("path", ["/demo/login/", "/api/items/"])
def test_a_request_through_the_middleware_and_a_door_inside_visits_few_modules(client, path):
    make_policy(name="inside", action="items" if path.startswith("/api/") else "login", limit=100)
    client.get(path, REMOTE_ADDR="203.0.113.7")
    route, every_call = walk(lambda: client.get(path, REMOTE_ADDR="203.0.113.7"))
    print(f"\nroute: {figures(route)}\nevery call: {figures(every_call)}")
    assert {"middleware", "engine"} <= set(route)
    assert len(set(route)) <= TWO_DOORS_MODULES and climbs(route) <= TWO_DOORS_CLIMBS, figures(route)
