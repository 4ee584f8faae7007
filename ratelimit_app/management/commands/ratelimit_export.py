"""manage.py ratelimit_export [FILE]: policies, overrides, action costs and plans as JSON (stdout without FILE)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from ratelimit_app.portable import export_data


class Command(BaseCommand):
    help = (
        "Export every rate limit policy with its overrides, the action costs and the plans, as JSON, "
        "for review or for ratelimit_import."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", help="Write here instead of standard output.")

    def handle(self, *args, file: str | None = None, **options):
        text = json.dumps(export_data(), indent=2, sort_keys=True) + "\n"
        if file:
            with open(file, "w", encoding="utf-8") as out:
                out.write(text)
            self.stderr.write(f"Wrote {file}")
        else:
            self.stdout.write(text, ending="")
