"""manage.py ratelimit_import FILE: create or update policies (by name) and replace their overrides."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from ratelimit_app.portable import ImportRefused, import_data


class Command(BaseCommand):
    help = "Import policies and overrides from a ratelimit_export file; all or nothing."

    def add_arguments(self, parser):
        parser.add_argument("file", help="A file written by ratelimit_export ('-' for standard input).")

    def handle(self, *args, file: str, **options):
        try:
            if file == "-":
                data = json.load(sys.stdin)
            else:
                with open(file, encoding="utf-8") as source:
                    data = json.load(source)
        except (OSError, json.JSONDecodeError) as error:
            raise CommandError(f"Cannot read {file}: {error}") from error
        try:
            policies, overrides = import_data(data)
        except ImportRefused as error:
            raise CommandError(str(error)) from error
        self.stdout.write(self.style.SUCCESS(f"Imported {policies} policies and {overrides} overrides."))
