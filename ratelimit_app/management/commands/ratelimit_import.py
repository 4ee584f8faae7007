"""manage.py ratelimit_import FILE: create or update policies (by name) and replace their overrides;
create or update action costs (by action); create or update plans (by name) and replace their limits
and assignments."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from ratelimit_app.portable import ImportRefused, import_data, parse_json


class Command(BaseCommand):
    help = "Import policies, overrides, action costs and plans from a ratelimit_export file; all or nothing."

    def add_arguments(self, parser):
        parser.add_argument("file", help="A file written by ratelimit_export ('-' for standard input).")

    def handle(self, *args, file: str, **options):
        try:
            if file == "-":
                text = sys.stdin.read()
            else:
                with open(file, encoding="utf-8") as source:
                    text = source.read()
        except (OSError, UnicodeDecodeError) as error:
            raise CommandError(f"Cannot read {file}: {error}") from error
        try:
            imported = import_data(parse_json(text))
        except ImportRefused as error:
            raise CommandError(f"{file}: {error}") from error
        parts = [counted(imported.policies, "policy", "policies"), counted(imported.overrides, "override", "overrides"),
                 counted(imported.costs, "action cost", "action costs")]
        if imported.plans:  # a file without plans reads as it always did
            assignments = counted(imported.assignments, "assignment", "assignments")
            parts.append(f"{counted(imported.plans, 'plan', 'plans')} ({assignments})")
        self.stdout.write(self.style.SUCCESS(f"Imported {', '.join(parts[:-1])} and {parts[-1]}."))


def counted(number: int, one: str, many: str) -> str:
    """'1 policy', '2 policies', '0 overrides'."""
    return f"{number} {one if number == 1 else many}"
