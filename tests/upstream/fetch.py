"""Fetch the upstream test files from the pinned source distributions on the package index, into var/.

They are never copied into the repository: `python -m tests.upstream.fetch` (or the runner test) downloads
each sdist once with pip and extracts the one test file.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "var" / "upstream"
# (requirement, member of the sdist, where the runner expects it)
FILES = (
    ("djangorestframework==3.18.3", "djangorestframework-3.18.3/tests/test_throttling.py", CACHE / "drf" / "test_throttling.py"),
    ("django-ratelimit==4.1.0", "django-ratelimit-4.1.0/django_ratelimit/tests.py", CACHE / "django_ratelimit" / "tests.py"),
)


def fetch() -> list[Path]:
    """The upstream test files, downloaded and extracted on first use; their paths."""
    for requirement, member, target in FILES:
        if target.exists():
            continue
        sdist = _download(requirement)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as archive:
            source = archive.extractfile(member)
            if source is None:
                raise RuntimeError(f"{sdist.name} holds no {member}")
            target.write_bytes(source.read())
    (CACHE / "django_ratelimit" / "__init__.py").touch()  # a package, so the file imports as django_ratelimit.tests
    return [target for _, _, target in FILES]


def _download(requirement: str) -> Path:
    sdists = CACHE / "sdists"
    name, version = requirement.split("==")
    found = sorted(sdists.glob(f"{name}-{version}.tar.gz")) if sdists.exists() else []
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", requirement, "-d", str(sdists)],
            check=True,
        )
        found = sorted(sdists.glob(f"{name}-{version}.tar.gz"))
    if not found:
        raise RuntimeError(f"pip downloaded no source distribution of {requirement} into {sdists}")
    return found[0]


if __name__ == "__main__":
    for path in fetch():
        print(path)
