"""python -m bench [--quick]: prints the benchmark table and writes bench/RESULTS.md.

Needs REDIS_URL (make bench starts a private server). Everything is measured against that one
server in this one run; figures are ratios to floors taken here, never absolute promises.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

WORK = Path(__file__).resolve().parent / ".work"


def configure() -> None:
    WORK.mkdir(exist_ok=True)
    database = WORK / "bench.sqlite3"
    database.unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    if not os.environ.get("REDIS_URL"):
        sys.exit("REDIS_URL is not set: run `make bench` (it starts a private Redis) or set it.")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples and no end-to-end run (a smoke test)")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "RESULTS.md"))
    options = parser.parse_args()
    configure()
    from bench import report, suites

    results = suites.run_all(quick=options.quick)
    text = report.render(results)
    print(text)
    Path(options.output).write_text(text, encoding="utf-8")
    print(f"written to {options.output}")


if __name__ == "__main__":
    main()
