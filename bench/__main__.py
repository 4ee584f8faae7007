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


def configure(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    database = work / "bench.sqlite3"
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
    parser.add_argument("--quick", action="store_true", help="few samples and short runs: a smoke test (under a minute)")
    parser.add_argument("--output", help="default: bench/RESULTS.md, or bench/.work/RESULTS-quick.md with --quick")
    parser.add_argument("--workdir", default=str(WORK), help="where the bench's own SQLite database goes")
    options = parser.parse_args()
    configure(Path(options.workdir))
    from bench import report, suites

    results = suites.run_all(quick=options.quick)
    text = report.render(results)
    print(text)
    output = Path(options.output or (WORK / "RESULTS-quick.md" if options.quick else WORK.parent / "RESULTS.md"))
    output.write_text(text, encoding="utf-8")
    print(f"written to {output}")


if __name__ == "__main__":
    main()
