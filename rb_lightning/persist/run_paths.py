"""Where a Lightning run keeps its checkpoints: ``<run>/version_<N>/checkpoints/last.ckpt``.

The layout of Lightning's loggers and ``ModelCheckpoint(save_last=True)``, read
by the saved-buffer reader (a run directory means its ``last.ckpt``) and by the
command line (``--ckpt_path last``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["LAST_CHECKPOINT", "latest_checkpoint", "run_checkpoint", "run_directories"]

#: The file name of ``ModelCheckpoint(save_last=True)``'s checkpoint.
LAST_CHECKPOINT = "last.ckpt"


def run_directories(run_root: str | os.PathLike | None) -> list[Path]:
    """A config's run directories, ``version_<N>``, oldest first (by ``N``).

    Examples:
        >>> run_directories("no/such/dir")
        []
    """
    if run_root is None or not Path(run_root).is_dir():
        return []
    found = []
    for path in Path(run_root).glob("version_*"):
        number = path.name.removeprefix("version_")
        if path.is_dir() and number.isdigit():
            found.append((int(number), path))
    return [path for _, path in sorted(found)]


def run_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """A run directory's ``checkpoints/last.ckpt``, if it has one."""
    path = Path(run_dir) / "checkpoints" / LAST_CHECKPOINT
    return path if path.is_file() else None


def latest_checkpoint(
    run_root: str | os.PathLike | None, *, extra_dirs: Iterable[str | os.PathLike] = ()
) -> Path | None:
    """The most recently written ``last.ckpt`` of a config's runs.

    Args:
        run_root: The directory holding a config's runs, e.g. ``runs/cartpole_dqn``:
            its ``version_*/checkpoints/last.ckpt`` are candidates.
        extra_dirs: More directories whose ``last.ckpt`` is a candidate (a
            ``ModelCheckpoint(dirpath=...)`` given explicitly).

    Examples:
        >>> latest_checkpoint("no/such/dir") is None
        True
    """
    candidates = [Path(d) / LAST_CHECKPOINT for d in extra_dirs]
    if run_root is not None and Path(run_root).is_dir():
        candidates += Path(run_root).glob(f"*/checkpoints/{LAST_CHECKPOINT}")
    existing = [path for path in candidates if path.is_file()]
    if not existing:
        return None
    return max(existing, key=lambda path: path.stat().st_mtime)
