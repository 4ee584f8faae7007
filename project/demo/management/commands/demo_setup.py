"""Create the demo's admin user and the demo policies that are missing; never undo an operator's edits."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from project.demo.policies import DEMO_POLICIES
from ratelimit_app.models import Policy


class Command(BaseCommand):
    help = (
        "Create the superuser (with a random password that is printed) unless it exists, and the demo "
        "policies that are missing; existing users and policies are left as they are."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--port", type=int, default=8000, help="The port the demo is served on, for the printed URL.")

    def handle(self, *args, username: str, port: int, **options):
        created, kept = self.load_missing_policies()
        self.stdout.write(
            f"Demo policies: {created} created, {kept} already there and left as they are "
            "(delete one in the admin to get its demo values back at the next `make run`)."
        )
        url = f"http://127.0.0.1:{port}/admin/"
        password = self.create_admin(username)
        if password is None:
            self.stdout.write(self.style.SUCCESS(f"Admin: {url}  user {username!r}, password unchanged"))
            self.stdout.write(f"Forgot it? python manage.py changepassword {username}")
        else:
            self.stdout.write(self.style.SUCCESS(f"Admin: {url}  user {username!r}  password {password!r}"))

    def load_missing_policies(self) -> tuple[int, int]:
        existing = set(Policy.objects.filter(name__in=[fields["name"] for fields in DEMO_POLICIES]).values_list("name", flat=True))
        for fields in DEMO_POLICIES:
            if fields["name"] not in existing:
                policy = Policy(**fields)
                policy.full_clean()
                policy.save()
        return len(DEMO_POLICIES) - len(existing), len(existing)

    def create_admin(self, username: str) -> str | None:
        """The new superuser's password, or None when the user exists already (its password is kept)."""
        users = get_user_model()
        if users.objects.filter(username=username).exists():
            return None
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser(username=username, email="admin@example.com", password=password)
        return password
