"""Places hit() takes where no door gives them back go back when the handler that started the request
finishes it (request_finished, after its response was closed), once however often it is finished; a
request no handler started keeps them until their lease ends (the servers' tests are in
test_review_doors.py and test_review_closing.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.signals import request_finished, request_started
from django.test import RequestFactory

import ratelimit_app
from tests.helpers import connections_kept, make_policy

pytestmark = pytest.mark.django_db


def made(ip: str = "203.0.113.7"):
    request = RequestFactory().get("/work/", REMOTE_ADDR=ip)
    request.user = AnonymousUser()
    return request


def started(ip: str = "203.0.113.7"):
    """A request as a WSGI handler starts it: request_started is sent in its context first."""
    request = made(ip)
    with connections_kept():
        request_started.send(sender=None, environ=request.META)
    return request


def finished() -> None:
    with connections_kept():
        request_finished.send(sender=None)


@pytest.fixture
def one_place():
    make_policy(name="work", action="work", strategy="concurrency", limit=1, window=60, key="ip")


def test_a_place_goes_back_when_the_request_is_finished(one_place):
    first = started()
    assert ratelimit_app.hit(first, "work").allowed
    assert not ratelimit_app.hit(made(), "work").allowed  # the place is held
    finished()
    assert ratelimit_app.hit(made(), "work").allowed


def test_finishing_twice_or_after_several_hits_gives_each_place_back_once(one_place):
    make_policy(name="other", action="work", strategy="concurrency", limit=1, window=60, key="ip")
    first = started()
    assert ratelimit_app.hit(first, "work").allowed  # both policies: two places
    assert not ratelimit_app.hit(made(), "work").allowed  # it holds them
    finished()
    finished()
    second = started()
    assert ratelimit_app.hit(second, "work").allowed
    assert not ratelimit_app.hit(made(), "work").allowed  # the second request's places, held once


def test_a_request_never_closed_keeps_its_place(one_place):
    """A request no handler started is not finished by Django: its place waits for its lease (the docs say so)."""
    assert ratelimit_app.hit(made(), "work").allowed
    assert not ratelimit_app.hit(made(), "work").allowed
