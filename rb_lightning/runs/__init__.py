"""A run from the command line: the CLI, its run directory, checkpoints, log and report.

``python train.py fit --config <run>`` and ``rb-lightning`` start here
(:mod:`rb_lightning.runs.cli`). The callbacks and the logger a config names
(``rb_lightning.runs.FinalLastCheckpoint``, ``rb_lightning.runs.RunLogger``) are
imported on first use, so the console scripts' start-up guard
(:mod:`rb_lightning.runs.startup`) imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rb_lightning.namespaces import lazy_names

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.persist.run_dirs import (
        RunCheckpoint,
        latest_checkpoint,
        read_run_checkpoint,
        run_checkpoint,
        run_directories,
    )
    from rb_lightning.runs.progress import StepProgressBar
    from rb_lightning.runs.report import RunReport
    from rb_lightning.runs.run_files import FinalLastCheckpoint, RunLogger

_HOMES = {
    "FinalLastCheckpoint": "rb_lightning.runs.run_files",
    "RunCheckpoint": "rb_lightning.persist.run_dirs",
    "RunLogger": "rb_lightning.runs.run_files",
    "RunReport": "rb_lightning.runs.report",
    "StepProgressBar": "rb_lightning.runs.progress",
    "latest_checkpoint": "rb_lightning.persist.run_dirs",
    "read_run_checkpoint": "rb_lightning.persist.run_dirs",
    "run_checkpoint": "rb_lightning.persist.run_dirs",
    "run_directories": "rb_lightning.persist.run_dirs",
}
__all__ = [
    "FinalLastCheckpoint",
    "RunCheckpoint",
    "RunLogger",
    "RunReport",
    "StepProgressBar",
    "latest_checkpoint",
    "read_run_checkpoint",
    "run_checkpoint",
    "run_directories",
]
__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
