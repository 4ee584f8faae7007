"""`make run` again keeps what the operator did: edited demo policies, the admin's password; and takes PORT."""

from __future__ import annotations

import io
import re
import subprocess

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from project.demo.policies import DEMO_POLICIES
from ratelimit_app.models import Policy
from tests.servers import ROOT

pytestmark = pytest.mark.django_db


def demo_setup(*args: str) -> str:
    out = io.StringIO()
    call_command("demo_setup", *args, stdout=out)
    return out.getvalue()


def test_first_run_creates_the_admin_with_the_printed_password_and_every_demo_policy():
    output = demo_setup()
    password = re.search(r"password '([^']+)'", output).group(1)
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    assert sorted(Policy.objects.values_list("name", flat=True)) == sorted(p["name"] for p in DEMO_POLICIES)
    assert "http://127.0.0.1:8000/admin/" in output


def test_a_second_run_keeps_the_operators_edits_and_restores_only_deleted_policies():
    demo_setup()
    edited = Policy.objects.get(name="search-per-ip")
    edited.limit, edited.mode = 50, "shadow"
    edited.save()
    Policy.objects.filter(name="login-per-ip").delete()

    output = demo_setup()

    edited.refresh_from_db()
    assert (edited.limit, edited.mode) == (50, "shadow")
    assert Policy.objects.get(name="login-per-ip").limit == 3
    assert f"1 created, {len(DEMO_POLICIES) - 1} already there" in output


def test_a_second_run_keeps_the_admin_password_and_says_how_to_reset_it():
    demo_setup()
    admin = User.objects.get(username="admin")
    admin.set_password("chosen by the operator")
    admin.save()

    output = demo_setup()

    assert User.objects.get(username="admin").check_password("chosen by the operator")
    assert "password '" not in output
    assert "python manage.py changepassword admin" in output


def test_the_port_given_to_make_run_is_served_and_printed():
    assert "http://127.0.0.1:8123/admin/" in demo_setup("--port", "8123")
    planned = subprocess.run(["make", "-n", "run", "PORT=8123"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "demo_setup --port 8123" in planned.stdout
    assert "runserver --noreload 127.0.0.1:8123" in planned.stdout
