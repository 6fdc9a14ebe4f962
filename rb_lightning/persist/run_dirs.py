"""Run directories: one versioned directory per run of a config, and what its checkpoint says.

A run logged under ``runs/<config>/`` gets ``runs/<config>/version_<N>/`` holding
``config.yaml``, ``metrics.csv``, ``curves.png`` and ``checkpoints/last.ckpt`` (the layout
of Lightning's loggers and ``ModelCheckpoint(save_last=True)``); a second ``fit`` of the
same config starts ``version_<N+1>``: nothing is overwritten. Read by the saved-buffer
reader (a run directory means its ``last.ckpt``) and by the command line (``--ckpt_path
last`` continues the run started last, in its own directory, when its checkpoint
(:func:`read_run_checkpoint`) says it can go on). Nothing here imports Lightning.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "LAST_CHECKPOINT",
    "RUN_FINISHED_KEY",
    "RunCheckpoint",
    "checkpoint_path_of",
    "describe_run",
    "latest_checkpoint",
    "read_run_checkpoint",
    "remove_unstarted_run",
    "run_checkpoint",
    "run_directories",
    "shown",
]

#: The file name of ``ModelCheckpoint(save_last=True)``'s checkpoint.
LAST_CHECKPOINT = "last.ckpt"
#: Key of ``FinalLastCheckpoint``'s state that says whether (and why) the run had ended.
RUN_FINISHED_KEY = "run_finished"


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


def checkpoint_path_of(path: str | os.PathLike) -> Path | None:
    """The Lightning checkpoint that ``path`` names, or ``None`` when it names none.

    A file is itself; a run directory (``runs/<config>/version_<N>``) means its
    ``checkpoints/last.ckpt``, a ``checkpoints`` directory the ``last.ckpt`` in it,
    and a config's directory of runs (``runs/<config>``) the ``last.ckpt``
    written most recently by any of its runs.

    Examples:
        >>> checkpoint_path_of("no/such/run") is None
        True
    """
    location = Path(path)
    if location.is_file():
        return location
    if not location.is_dir():
        return None
    in_run = run_checkpoint(location)
    if in_run is not None:
        return in_run
    if (location / LAST_CHECKPOINT).is_file():
        return location / LAST_CHECKPOINT
    return latest_checkpoint(location)


#: What a fit writes into its new run directory before its first step.
_WRITTEN_AT_START = {"config.yaml", "hparams.yaml"}


def remove_unstarted_run(run_dir: Path) -> bool:
    """Remove ``run_dir`` if it holds only what a fit writes before its first step (else ``--ckpt_path last`` would pick a run with nothing to resume)."""
    if not run_dir.is_dir():
        return False
    entries = list(run_dir.iterdir())
    if not all(entry.is_file() and entry.name in _WRITTEN_AT_START for entry in entries):
        return False
    for entry in entries:
        entry.unlink()
    run_dir.rmdir()
    return True


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, as a user types it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _describe_end(found: RunCheckpoint) -> str:
    step = "step ?" if found.step is None else f"step {found.step:,}"
    if found.finished == "max_steps":
        return f"finished at max_steps, {step}"
    if found.finished:
        return f"finished, {step}"
    return f"resumable from {step}"


def describe_run(run_dir: Path) -> str:
    path = run_checkpoint(run_dir)
    return f"{shown(path)} ({_describe_end(read_run_checkpoint(path))})" if path else f"{run_dir}"


@dataclass(frozen=True)
class RunCheckpoint:
    """What a run's ``last.ckpt`` says of the run, read without loading the model or buffer.

    Attributes:
        path: The checkpoint file.
        step: Its global step (``None`` if the file cannot be read).
        finished: Why the run had ended when it was written (``"max_steps"``,
            ``"stopped"``), or ``None`` for a run that can go on (written on
            schedule, on Ctrl-C, or before a kill).
        problem: Why the file is not a Lightning checkpoint, in words (``None``
            when it is one).
    """

    path: Path
    step: int | None
    finished: str | None
    problem: str | None = None

    @property
    def run_dir(self) -> Path:
        """``runs/<config>/version_<N>`` for ``.../version_<N>/checkpoints/last.ckpt``."""
        return self.path.parent.parent


def read_run_checkpoint(path: str | os.PathLike) -> RunCheckpoint:
    """Read a checkpoint's step and whether its run had finished (memory-mapped, no pickle).

    Examples:
        >>> read_run_checkpoint("no/such/last.ckpt").step is None
        True
    """
    path = Path(path)
    problem = _not_a_checkpoint(path)
    if problem is not None:
        return RunCheckpoint(path, None, None, problem)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # torn, or holding pickled objects: the caller says so
        return RunCheckpoint(path, None, None, _UNREADABLE)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        return RunCheckpoint(path, None, None, _NOT_LIGHTNING)
    finished = None
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and state.get(RUN_FINISHED_KEY):
            finished = str(state[RUN_FINISHED_KEY])
    step = checkpoint.get("global_step")
    return RunCheckpoint(path, int(step) if step is not None else None, finished)


_UNREADABLE = "it is torn, or holds pickled Python objects, which a Lightning checkpoint never does"
_NOT_LIGHTNING = "torch.save wrote it, but not Lightning: it holds no model state_dict"


def _not_a_checkpoint(path: Path) -> str | None:
    """Why ``path`` cannot be a checkpoint (not a zip archive, as ``torch.save`` writes), or ``None`` if it may be one."""
    if not path.is_file():
        return "no such file"
    if path.stat().st_size == 0:
        return "it is empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        return "it is not a zip archive, as every checkpoint Lightning writes is"
    return None
