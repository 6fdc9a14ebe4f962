"""Run directories: one versioned directory per run of a config, found again by ``--ckpt_path last``.

The shipped configs log with :class:`RunLogger` under ``runs/<config>/``, so
every ``fit`` gets ``runs/<config>/version_<N>/`` holding ``config.yaml``,
``metrics.csv``, ``curves.png`` and ``checkpoints/last.ckpt``. A second
``fit`` of the same config starts ``version_<N+1>``: nothing is overwritten.
``--ckpt_path last`` resumes the run whose ``last.ckpt`` was written most
recently, in its own directory (:func:`latest_checkpoint`).
"""

from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

__all__ = ["FinalLastCheckpoint", "RunLogger", "latest_checkpoint"]

LAST_CHECKPOINT = "last.ckpt"


class RunLogger(CSVLogger):
    """Lightning's ``CSVLogger``, except that a run resumed in its own directory keeps its metrics.

    ``CSVLogger`` deletes ``metrics.csv`` when it opens a directory that has one;
    a run resumed with ``--ckpt_path last`` logs into the directory it started
    in, so this logger appends to the file instead (a step logged twice, after
    the checkpoint and before an interruption, is read back with its latest value
    by :func:`rb_lightning.curves.read_metrics`).

    Args: as ``lightning.pytorch.loggers.CSVLogger`` (``save_dir``, ``name``,
    ``version``, ...).

    Examples:
        >>> import tempfile
        >>> logger = RunLogger(save_dir=tempfile.mkdtemp(), name="demo")
        >>> logger.log_metrics({"loss": 1.0}, step=0); logger.save()
        >>> again = RunLogger(save_dir=logger.save_dir, name="demo", version=logger.version)
        >>> again.log_metrics({"loss": 0.5}, step=1); again.save()
        >>> open(f"{again.log_dir}/metrics.csv").read().split()
        ['loss,step', '1.0,0', '0.5,1']
    """

    @property
    def experiment(self) -> Any:  # Lightning types it with its private _ExperimentWriter
        if self._experiment is not None:
            return self._experiment
        metrics = Path(self.log_dir) / "metrics.csv"
        kept = metrics.read_bytes() if metrics.is_file() else None
        with warnings.catch_warnings():
            # "...will be deleted when the new ones are saved": not with the file put back below.
            warnings.filterwarnings("ignore", message="Experiment logs directory")
            writer = super().experiment
        if kept is not None and hasattr(writer, "metrics_keys"):
            metrics.write_bytes(kept)
            with open(metrics, newline="") as file:
                writer.metrics_keys = list(csv.DictReader(file).fieldnames or [])
        return writer


class FinalLastCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` always holds the final step of a finished fit.

    Lightning's writes ``last.ckpt`` when it saves on its schedule
    (``every_n_train_steps``...) and at the end of training only if it never
    saved before, so a run that stops between two scheduled saves (a goal
    reached at step 12,345 with saves every 1,000) would leave a ``last.ckpt``
    of step 12,000 to ``test`` and to resume. This one rewrites it when ``fit``
    ends. Arguments: as ``ModelCheckpoint``; ``save_last`` defaults to ``True``.

    Examples:
        >>> FinalLastCheckpoint(every_n_train_steps=1000).save_last
        True
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            verbose=verbose,
            save_last=save_last,
            **kwargs,
        )

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self.save_last and self.dirpath is not None and not trainer.sanity_checking:
            path = os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
            # A whole checkpoint (loops, callbacks, the buffer): resume reads all of it. Said
            # explicitly, else Lightning logs "weights_only was not set" under the summary.
            trainer.save_checkpoint(path, weights_only=self.save_weights_only)
            self.last_model_path = path


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
