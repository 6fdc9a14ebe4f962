"""Check what the built sdist and wheel hold: ``python .ci/check_dist.py DIST_DIR BUILD_LOG``.

The wheel must carry every module of the checkout, ``py.typed``, the license and
every shipped config (as ``rb_lightning/configs/``); the sdist the license and
``configs/`` (the wheel is built from it); the metadata an SPDX license; and the
build log no deprecation warning. Prints one line per problem and exits 1 on any.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tracked(pattern: str) -> set[str]:
    """Files of the checkout that git tracks, matching ``pattern`` (e.g. ``configs/*.yaml``)."""
    out = subprocess.run(
        ["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def main(dist: Path, build_log: Path) -> list[str]:
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    problems = []

    wheel_files = set(zipfile.ZipFile(wheel).namelist())
    info = next(n.split("/")[0] for n in wheel_files if n.split("/")[0].endswith(".dist-info"))
    configs = tracked("configs/*.yaml")
    expected = {
        "rb_lightning/py.typed",
        f"{info}/licenses/LICENSE",
        *(f"rb_lightning/{path}" for path in configs),
        *tracked("rb_lightning/*.py"),
    }
    problems += [f"{wheel.name}: no {name}" for name in sorted(expected - wheel_files)]
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    if "License-Expression: MIT" not in metadata.splitlines():
        problems.append(f"{wheel.name}: METADATA has no 'License-Expression: MIT'")

    with tarfile.open(sdist) as archive:
        sdist_files = {name.split("/", 1)[-1] for name in archive.getnames()}
    for name in sorted({"LICENSE", "pyproject.toml", *configs} - sdist_files):
        problems.append(f"{sdist.name}: no {name}")

    warnings = [line for line in build_log.read_text().splitlines() if "deprecat" in line.lower()]
    problems += [f"build log: {line.strip()}" for line in warnings]
    return problems


if __name__ == "__main__":
    found = main(Path(sys.argv[1]), Path(sys.argv[2]))
    for problem in found:
        print(f"check_dist: {problem}", file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"check_dist: wheel and sdist ok ({len(tracked('configs/*.yaml'))} configs)")
