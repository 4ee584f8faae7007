"""Places hit() takes where no door gives them back go back when Django closes the request (after its
response), which also reaches requests whose context request_started did not (the servers' tests are in
test_review_doors.py and test_review_closing.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

import ratelimit_app
from tests.helpers import make_policy

pytestmark = pytest.mark.django_db


def made(ip: str = "203.0.113.7"):
    request = RequestFactory().get("/work/", REMOTE_ADDR=ip)
    request.user = AnonymousUser()
    return request


@pytest.fixture
def one_place():
    make_policy(name="work", action="work", strategy="concurrency", limit=1, window=60, key="ip")


def test_a_place_goes_back_when_the_request_is_closed(one_place):
    first = made()
    assert ratelimit_app.hit(first, "work").allowed
    assert not ratelimit_app.hit(made(), "work").allowed  # the place is held
    first.close()
    assert ratelimit_app.hit(made(), "work").allowed


def test_closing_twice_or_after_several_hits_gives_each_place_back_once(one_place):
    make_policy(name="other", action="work", strategy="concurrency", limit=1, window=60, key="ip")
    first = made()
    assert ratelimit_app.hit(first, "work").allowed  # both policies: two places
    first.close()
    first.close()
    second = made()
    assert ratelimit_app.hit(second, "work").allowed
    assert not ratelimit_app.hit(made(), "work").allowed  # the second request's places, held once


def test_a_request_never_closed_keeps_its_place(one_place):
    """A request made by hand is not closed by Django: its place waits for its lease (the docs say so)."""
    assert ratelimit_app.hit(made(), "work").allowed
    assert not ratelimit_app.hit(made(), "work").allowed
