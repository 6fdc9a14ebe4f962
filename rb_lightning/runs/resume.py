"""``--ckpt_path last`` from a config: where its runs live, whether one can go on, what is said.

Read from the parsed config (a jsonargparse ``Namespace``) before anything is
built, so ``--ckpt_path last`` can pick the run, check that it can go on, and
say in one line what the command does.
"""

from __future__ import annotations

import os
from pathlib import Path

from jsonargparse import Namespace

from rb_lightning.errors import ConfigError
from rb_lightning.persist.run_dirs import RunCheckpoint, shown
from rb_lightning.runs.config_errors import import_class
from rb_lightning.runs.run_files import RunLogger


def _logger_entries(trainer: Namespace) -> list[Namespace]:
    logger = trainer.get("logger")
    entries = logger if isinstance(logger, list) else [logger]
    return [entry for entry in entries if isinstance(entry, Namespace) and "class_path" in entry]


def has_logger(trainer: Namespace) -> bool:
    return trainer.get("logger") not in (False, None) or bool(_logger_entries(trainer))


def run_root(trainer: Namespace) -> Path | None:
    """Where a config's run directories (``version_<N>``) are made."""
    for entry in _logger_entries(trainer):
        args = entry.get("init_args") or Namespace()
        if args.get("save_dir") is not None:
            return Path(args.save_dir) / (args.get("name") or "lightning_logs")
    if trainer.get("logger") is False:
        return None
    return Path(trainer.get("default_root_dir") or os.getcwd()) / "lightning_logs"


def checkpoint_dirs(trainer: Namespace) -> list[Path]:
    """``dirpath`` of every checkpoint callback the config gives one explicitly."""
    callbacks = trainer.get("callbacks") or []
    dirs = []
    for entry in callbacks if isinstance(callbacks, list) else [callbacks]:
        # ModelCheckpoint and its subclasses (rb_lightning.runs.FinalLastCheckpoint).
        if isinstance(entry, Namespace) and str(entry.get("class_path", "")).endswith("Checkpoint"):
            dirpath = (entry.get("init_args") or Namespace()).get("dirpath")
            if dirpath is not None:
                dirs.append(Path(dirpath))
    return dirs


def set_logger_args(trainer: Namespace, *, version: str, purge_step: int | None) -> None:
    for entry in _logger_entries(trainer):
        if entry.get("init_args") is None:
            entry.init_args = Namespace()
        entry.init_args.version = version
        if import_class(str(entry.get("class_path"))) is RunLogger:
            entry.init_args.purge_step = purge_step


def check_extends(found: RunCheckpoint, trainer: Namespace) -> None:
    """A run that ended at ``max_steps`` goes on only with a larger ``max_steps``."""
    max_steps = trainer.get("max_steps")
    if found.finished != "max_steps" or found.step is None:
        return
    if max_steps is None or 0 <= max_steps <= found.step:
        raise ConfigError(
            "trainer.max_steps",
            f"{shown(found.path)} is of a run that finished at max_steps (step "
            f"{found.step:,}); fit would stop again before a step. To train it further, pass "
            f"--trainer.max_steps above {found.step:,}; to start a new run, leave out "
            "--ckpt_path.",
        )


def resume_line(subcommand: str, found: RunCheckpoint, trainer: Namespace, in_own_run: bool) -> str:
    step = "an unknown step" if found.step is None else f"step {found.step:,}"
    if subcommand != "fit":
        return f"{subcommand}: the model of {shown(found.path)} ({step})"
    if not in_own_run:  # a checkpoint outside this config's run directories
        return f"fit: resuming from {shown(found.path)} ({step})"
    if found.finished:
        max_steps = trainer.get("max_steps")
        bound = f" to max_steps={max_steps:,}" if max_steps is not None and max_steps > 0 else ""
        return (
            f"fit: extending the finished run {shown(found.run_dir)} from {step}{bound} "
            f"({found.path.name})"
        )
    return f"fit: resuming {shown(found.run_dir)} from {step} ({found.path.name})"


__all__ = [
    "check_extends",
    "checkpoint_dirs",
    "has_logger",
    "resume_line",
    "run_root",
    "set_logger_args",
]
