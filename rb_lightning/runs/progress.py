"""``StepProgressBar``: a training bar that counts optimizer steps against ``max_steps``.

Lightning's bar restarts every epoch (``Epoch 235/-2``); this one shows ``step
23,500/60,000`` and the logged metrics. Bars a log would keep as stale lines (sanity
check, ``0/?`` bars, the nested validation bar) are not drawn. Into a file or a pipe the
bar is a plain line every ``line_every_s`` seconds and one at the end:
``step 1,200/60,000 (2%) | 118.3 steps/s | loss=0.12`` (this process's steps, so the rate
holds across a resume).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import tqdm.std
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, convert_inf

__all__ = ["StepProgressBar", "progress_bars_lock_threads_only"]


def progress_bars_lock_threads_only() -> None:
    """Give tqdm a thread lock before its first bar: its default ``multiprocessing.RLock`` is, under spawn, a named semaphore in ``/dev/shm`` that a killed run leaves behind."""
    if "_lock" not in vars(tqdm.std.tqdm):
        tqdm.std.tqdm.set_lock(threading.RLock())


class StepProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` whose training bar spans the whole run in optimizer steps (with a finite ``max_steps``).

    Args:
        refresh_rate: As Lightning's ``TQDMProgressBar``.
        process_position: As Lightning's ``TQDMProgressBar``.
        leave: As Lightning's ``TQDMProgressBar``.
        lines: Plain lines instead of a bar; ``None`` (default): when stdout is not a terminal.
        line_every_s: Seconds between two lines.

    Examples:
        >>> import lightning as L
        >>> bar = StepProgressBar()
        >>> trainer = L.Trainer(max_steps=3, callbacks=[bar], logger=False,
        ...                     enable_checkpointing=False, enable_model_summary=False)
        >>> bar.is_enabled
        True
    """

    def __init__(
        self,
        refresh_rate: int = 1,
        process_position: int = 0,
        leave: bool = False,
        lines: bool | None = None,
        line_every_s: float = 10.0,
    ) -> None:
        super().__init__(refresh_rate, process_position, leave)
        self.lines = lines
        self.line_every_s = float(line_every_s)
        self._started = (0.0, 0)  # when, and at which step, this process's training started
        self._last_line = (0.0, -1)  # when, and at which step, the last line was printed

    def _writes_lines(self) -> bool:
        return not sys.stdout.isatty() if self.lines is None else self.lines

    def _counts_steps(self, trainer: Trainer) -> bool:
        return trainer.max_steps is not None and trainer.max_steps > 0

    def init_sanity_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)

    def init_validation_tqdm(self) -> Tqdm:
        if self.trainer.state.fn == "fit":
            return Tqdm(disable=True)
        return self._eval_tqdm(self.validation_description, self.trainer.num_val_batches)

    def init_test_tqdm(self) -> Tqdm:
        return self._eval_tqdm(self.test_description, self.trainer.num_test_batches)

    def _eval_tqdm(self, description: str, batches: Any) -> Tqdm:
        # Opened with its first loader's total: no "Validation: 0/?" line before it.
        first = batches[0] if isinstance(batches, list) and batches else batches
        return Tqdm(
            desc=f"{description} DataLoader 0",
            total=convert_inf(first),
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            bar_format=self.BAR_FORMAT,
        )

    def init_train_tqdm(self) -> Tqdm:
        if not self._counts_steps(self.trainer):
            return super().init_train_tqdm()
        # Opened with its total: no "Training: 0/?" line before it. A resumed run starts where
        # it stopped; its rate counts only its own steps.
        now = time.monotonic()
        self._started, self._last_line = (now, self.trainer.global_step), (now, -1)
        return Tqdm(
            desc="step",
            total=self.trainer.max_steps,
            initial=self.trainer.global_step,
            position=2 * self.process_position,
            disable=self.is_disabled or self._writes_lines(),
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    def on_train_epoch_start(self, trainer: Trainer, *args: Any) -> None:
        if not self._counts_steps(trainer):
            super().on_train_epoch_start(trainer, *args)

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self._counts_steps(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar = self.train_progress_bar
        step = trainer.global_step
        if self._writes_lines():
            bar.n = step
            if time.monotonic() - self._last_line[0] >= self.line_every_s:
                self._print_line(trainer, pl_module)
        elif not bar.disable and (step % self.refresh_rate == 0 or step == trainer.max_steps):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The last values, as the run ends (the summary below prints them too)."""
        if not self._counts_steps(trainer) or self.is_disabled:
            return super().on_train_end(trainer, pl_module)
        if self._writes_lines():
            if self._last_line[1] != trainer.global_step:
                self._print_line(trainer, pl_module)
        else:
            bar = self.train_progress_bar
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))
        super().on_train_end(trainer, pl_module)

    def _print_line(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.is_disabled:
            return
        now, step = time.monotonic(), trainer.global_step
        self._last_line = (now, step)
        total = trainer.max_steps
        started_at, started_step = self._started
        rate = (step - started_step) / max(now - started_at, 1e-9)
        values = ", ".join(
            f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
            for name, value in self.get_metrics(trainer, pl_module).items()
        )
        line = f"step {step:,}/{total:,} ({100 * step // total}%) | {rate:.1f} steps/s"
        print(f"{line} | {values}" if values else line, flush=True)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._counts_steps(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        # Lightning leaves the bar's line open on Ctrl-C; what is printed next (RunReport's
        # summary) would be glued to it.
        try:
            bar = self.train_progress_bar
        except TypeError:  # no training bar yet
            return
        if self._writes_lines() and self._counts_steps(trainer):
            if self._last_line[1] != trainer.global_step:  # where the run stopped
                self._print_line(trainer, pl_module)
            return
        bar.close()

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the run directory says it; the summary prints it
        return metrics
