"""What writes a run's files: :class:`RunLogger` (``metrics.csv``) and :class:`FinalLastCheckpoint`.

The shipped configs log with :class:`RunLogger` under ``runs/<config>/`` and save with
:class:`FinalLastCheckpoint`, so every ``fit`` gets its run directory
(:mod:`rb_lightning.persist.run_dirs`), which ``--ckpt_path last`` finds again.
"""

from __future__ import annotations

import csv
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from rb_lightning.persist.run_dirs import RUN_FINISHED_KEY

__all__ = [
    "FinalLastCheckpoint",
    "RunLogger",
]


class RunLogger(CSVLogger):
    """Lightning's ``CSVLogger``, except that a run resumed in its own directory keeps its metrics.

    ``CSVLogger`` deletes an existing ``metrics.csv``; this one appends, dropping rows at
    ``purge_step`` and after (the resumed run logs them again), as TensorBoard's
    ``purge_step`` does. Other arguments are ``CSVLogger``'s.

    Args:
        purge_step: Drop the kept rows whose ``step`` is at least this one (``None``: keep all).

    Examples:
        >>> import tempfile
        >>> logger = RunLogger(save_dir=tempfile.mkdtemp(), name="demo")
        >>> logger.log_metrics({"loss": 1.0}, step=0); logger.log_metrics({"loss": 0.9}, step=1)
        >>> logger.save()
        >>> again = RunLogger(save_dir=logger.save_dir, name="demo", version=logger.version,
        ...                   purge_step=1)
        >>> again.log_metrics({"loss": 0.5}, step=1); again.save()
        >>> open(f"{again.log_dir}/metrics.csv").read().split()
        ['loss,step', '1.0,0', '0.5,1']
    """

    def __init__(self, *args: Any, purge_step: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.purge_step = purge_step

    @property
    def experiment(self) -> Any:  # Lightning types it with its private _ExperimentWriter
        if self._experiment is not None:
            return self._experiment
        metrics = Path(self.log_dir) / "metrics.csv"
        kept = _read_rows(metrics) if metrics.is_file() else None
        with warnings.catch_warnings():
            # "...will be deleted when the new ones are saved": not with the file put back below.
            warnings.filterwarnings("ignore", message="Experiment logs directory")
            writer = super().experiment
        if kept is not None and hasattr(writer, "metrics_keys"):
            keys, rows = kept
            if self.purge_step is not None:
                rows = [row for row in rows if not _at_or_after(row, self.purge_step)]
            # Written aside and renamed: a reader of the file (a user's `tail`, a dashboard)
            # never meets it empty.
            partial = metrics.with_name(metrics.name + ".tmp")
            with open(partial, "w", newline="") as file:
                out = csv.DictWriter(file, fieldnames=keys)
                out.writeheader()
                out.writerows(rows)
            os.replace(partial, metrics)
            writer.metrics_keys = keys
        return writer


def _read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        return list(reader.fieldnames or []), list(reader)


def _at_or_after(row: dict[str, str], step: int) -> bool:
    try:
        return int(row.get("step") or -1) >= step
    except ValueError:
        return False


class FinalLastCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` holds the final step of a fit, and a Ctrl-C's step.

    Lightning's writes ``last.ckpt`` on its schedule, so a run stopping between two saves
    would leave an older one. This one also writes it at the step that reaches ``max_steps``
    and at the end of the epoch the Trainer was told to stop in, with a scheduled
    checkpoint's loop state (a larger ``max_steps`` continues as if it never stopped), and on
    Ctrl-C after the step under way (a second Ctrl-C stops at once). The checkpoint records
    whether the run had finished, so ``--ckpt_path last`` does not extend it unasked. The
    other arguments are ``ModelCheckpoint``'s; ``save_last`` defaults to ``True``.

    Args:
        save_on_interrupt: Write ``last.ckpt`` when Ctrl-C stops the run (one process, main
            thread, Python's default handler; DDP ranks keep Lightning's behaviour).
        enable_version_counter: Off: ``last.ckpt`` is rewritten, never joined by
            ``last-v1.ckpt``.

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
        save_on_interrupt: bool = True,
        enable_version_counter: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            verbose=verbose,
            save_last=save_last,
            enable_version_counter=enable_version_counter,
            **kwargs,
        )
        self.save_on_interrupt = bool(save_on_interrupt)
        #: Why the run ended, once it has: ``"max_steps"`` or ``"stopped"``.
        self.finished: str | None = None
        # (global step, finished) of the last full checkpoint this trainer wrote
        self._written: tuple[int, str | None] | None = None
        self._interrupt = _DeferredInterrupt()

    # -- when to write last.ckpt --------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.finished = None
        if self.save_on_interrupt and trainer.world_size == 1:
            self._interrupt.install(lambda: trainer.global_step > 0)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        # Raised here, not where the checkpoint was written: what Lightning does after
        # a step (its logged row, a validation) happens as after a scheduled checkpoint.
        # A Ctrl-C that came after the last step's checkpoint point waits for this step's.
        if self._written is not None and self._written[0] == trainer.global_step:
            self._interrupt.raise_if_requested()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            self.finished = "max_steps"
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        if self.finished or self._interrupt.requested:
            self._save_final(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        max_epochs = trainer.max_epochs
        if trainer.should_stop or (max_epochs and 0 < max_epochs <= trainer.current_epoch + 1):
            self.finished = self.finished or "stopped"
        super().on_train_epoch_end(trainer, pl_module)
        if self.finished:
            self._save_final(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Not ModelCheckpoint's: it would write last.ckpt again here, from the finished loop.
        self._interrupt.uninstall()
        if not trainer.sanity_checking:
            self.finished = self.finished or "stopped"
            self._save_final(trainer)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self._interrupt.uninstall()
        super().on_exception(trainer, pl_module, exception)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._interrupt.uninstall()
        super().teardown(trainer, pl_module, stage)

    # -- what the checkpoint says about the run -----------------------------------------------
    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        self._written = (trainer.global_step, self.finished)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), RUN_FINISHED_KEY: self.finished}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A resumed run goes on: what the checkpoint said of its end is history.
        state = {k: v for k, v in state_dict.items() if k != RUN_FINISHED_KEY}
        super().load_state_dict(state)

    def _save_final(self, trainer: Trainer) -> None:
        if not self.save_last or self.dirpath is None:
            return
        if self._written == (trainer.global_step, self.finished):
            return  # the scheduled save of this step wrote the same checkpoint
        path = os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
        with self._interrupt.ignored():
            # A whole checkpoint (loops, callbacks, the buffer): resume reads all of it. Said
            # explicitly, else Lightning logs "weights_only was not set" under the summary.
            trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        self.last_model_path = path


class _DeferredInterrupt:
    """Ctrl-C that stops a run at the end of its step instead of in the middle of it."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def install(self, defer: Callable[[], bool]) -> None:
        """Take over Ctrl-C; ``defer()`` says whether a press waits for the step's end."""
        self.requested = False
        in_main = threading.current_thread() is threading.main_thread()
        if not in_main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return  # a worker thread, or a handler of the user's own: leave Ctrl-C alone

        def on_ctrl_c(signum: int, frame: Any) -> None:
            if self.requested or not defer():
                self.uninstall()
                raise KeyboardInterrupt
            self.requested = True
            self.uninstall()  # a second Ctrl-C stops at once
            print(
                "\nCtrl-C: stopping after this step and writing a checkpoint "
                "(Ctrl-C again stops at once and keeps the previous one)",
                file=sys.stderr,
                flush=True,
            )

        self._previous = signal.signal(signal.SIGINT, on_ctrl_c)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def raise_if_requested(self) -> None:
        if self.requested:
            self.requested = False
            raise KeyboardInterrupt

    @contextmanager
    def ignored(self) -> Iterator[None]:
        """Ctrl-C is ignored inside: a checkpoint being written is finished, not torn."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
