"""Create an admin user with a fresh random password and load the demo policies."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from project.demo.policies import DEMO_POLICIES
from ratelimit_app.models import Policy


class Command(BaseCommand):
    help = "Create (or reset the password of) the 'admin' superuser and load the demo policies."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username: str, **options):
        password = secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username=username, defaults={"email": "admin@example.com"})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        for fields in DEMO_POLICIES:
            policy = Policy.objects.filter(name=fields["name"]).first() or Policy()
            for name, value in fields.items():
                setattr(policy, name, value)
            policy.full_clean()
            policy.save()
        self.stdout.write(f"Loaded {len(DEMO_POLICIES)} demo policies.")
        self.stdout.write(self.style.SUCCESS(f"Admin: http://127.0.0.1:8000/admin/  user {username!r}  password {password!r}"))
