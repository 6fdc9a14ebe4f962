"""``RunReport``: end every ``fit`` with why it stopped, where it got, and where its files are.

The command line adds it to every run; in Python, pass it to the Trainer::

    trainer = L.Trainer(callbacks=[RunReport(curves=["episode_return", "loss"], curve_x="frames")])

At the end of ``fit`` (and when it is interrupted with Ctrl-C) it draws the
logged metrics into ``curves.png`` in the run directory (needs matplotlib, the
``plot`` extra, and Lightning's ``CSVLogger``) and prints, for example::

    fit stopped at step 9,800 after 21.7 s: goal reached, episode_return 500.00 >= 475.0
      episode_return 500 | frames 20,464 | loss 0.03278
      checkpoint  runs/cartpole_dqn/version_0/checkpoints/last.ckpt (step 9,800)
      metrics     runs/cartpole_dqn/version_0/metrics.csv
      curves      runs/cartpole_dqn/version_0/curves.png
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_warn

from rb_lightning.persist.run_dirs import read_run_checkpoint
from rb_lightning.runs.curves import draw_curves, read_metrics

__all__ = ["RunReport"]

CURVES_FILE = "curves.png"


class RunReport(Callback):
    """Print a run's summary and draw its learning curves when ``fit`` ends or is interrupted.

    Args:
        curves: Logged metrics to draw, one panel each; ``None``: all of them.
        curve_x: The x axis: ``"step"`` or a logged metric that grows with the
            steps, e.g. ``"frames"`` (logged by ``OnlineCollector``).
        draw: Draw ``curves.png`` (skipped with a note when matplotlib is missing).
        resume_hint: A command line printed after an interrupted run, saying how
            to continue it (the command line sets it).

    Examples:
        >>> report = RunReport(curves=["loss"])
        >>> report.stop_reason is None
        True
    """

    def __init__(
        self,
        curves: list[str] | None = None,
        curve_x: str = "step",
        draw: bool = True,
        resume_hint: str | None = None,
    ) -> None:
        super().__init__()
        self.curves = None if curves is None else list(curves)
        self.curve_x = curve_x
        self.draw = bool(draw)
        self.resume_hint = resume_hint
        #: Why the last fit stopped, in words (``None`` before it ends).
        self.stop_reason: str | None = None
        #: The curves PNG of the last fit, if one was drawn.
        self.curves_path: Path | None = None
        self._started = time.perf_counter()

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._started = time.perf_counter()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, _stop_reason(trainer), interrupted=False)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, KeyboardInterrupt) and trainer.state.fn == "fit":
            self._finish(trainer, "interrupted (Ctrl-C)", interrupted=True)

    # -- the report -------------------------------------------------------------------------
    def _finish(self, trainer: Trainer, reason: str, *, interrupted: bool) -> None:
        self.stop_reason = reason
        if not trainer.is_global_zero:
            return
        if interrupted and trainer.global_step == 0 and trainer.ckpt_path is None:
            removed = _remove_unstarted_run(trainer)
            where = f" (removed {_relative(removed)})" if removed else ""
            print(
                f"fit stopped by Ctrl-C before its first step: nothing to resume{where}", flush=True
            )
            return
        metrics_file = _metrics_file(trainer)
        if metrics_file is not None and self.curves:
            _warn_never_logged(self.curves, trainer, metrics_file)
        curve_note = None
        if self.draw and metrics_file is not None:
            try:
                self.curves_path = draw_curves(
                    metrics_file,
                    metrics_file.parent / CURVES_FILE,
                    metrics=self.curves,
                    x=self.curve_x,
                    title=f"{type(trainer.lightning_module).__name__}, "
                    f"{metrics_file.parent.parent.name}/{metrics_file.parent.name}",
                )
            except ImportError as err:
                curve_note = f"not drawn: {err}"
        elapsed = time.perf_counter() - self._started
        lines = [f"fit stopped at step {trainer.global_step:,} after {elapsed:.1f} s: {reason}"]
        shown = _headline_metrics(trainer)
        if shown:
            lines.append("  " + " | ".join(shown))
        checkpoint = _checkpoint_path(trainer)
        rows = [
            ("checkpoint", _with_step(checkpoint) if checkpoint else "none written"),
            ("metrics", metrics_file),
            ("curves", self.curves_path or curve_note),
        ]
        lines += [f"  {name:<11} {_relative(value)}" for name, value in rows if value]
        if interrupted and self.resume_hint and checkpoint:
            lines.append(f"  resume      {self.resume_hint}")
        print("\n".join(lines), flush=True)


def _warn_never_logged(curves: list[str], trainer: Trainer, metrics_file: Path) -> None:
    """Warn about requested curves the run never logged (not for a run shorter than its logging or validation interval)."""
    every = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
    val_every = trainer.val_check_interval
    if isinstance(val_every, int) and trainer.limit_val_batches != 0:
        every = max(every, val_every)
    if trainer.global_step < every:
        return
    logged = {*read_metrics(metrics_file), *trainer.callback_metrics}
    missing = [name for name in curves if name not in logged]
    if missing:
        rank_zero_warn(
            f"RunReport(curves=...) asks for {missing}, which this run never logged, so "
            f"curves.png has no panel for {'it' if len(missing) == 1 else 'them'}. The run "
            f"logged: {sorted(logged)}. Name those in curves (in a config: the RunReport "
            "callback's init_args.curves)."
        )


def _stop_reason(trainer: Trainer) -> str:
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        reason = getattr(callback, "stop_reason", None)  # a callback that says why it stopped
        if isinstance(reason, str):
            return reason
        if isinstance(callback, EarlyStopping) and (
            callback.stopping_reason != EarlyStoppingReason.NOT_STOPPED
        ):
            if callback.stopping_reason == EarlyStoppingReason.STOPPING_THRESHOLD:
                value = trainer.callback_metrics.get(callback.monitor or "")
                shown = f"{float(value):.2f}" if value is not None else "?"
                sign = ">=" if callback.mode == "max" else "<="
                return (
                    f"goal reached, {callback.monitor} {shown} {sign} {callback.stopping_threshold}"
                )
            return f"early stopping: {callback.stopping_reason_message or callback.stopping_reason}"
    if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
        return f"max_steps={trainer.max_steps:,} reached"
    max_epochs = trainer.max_epochs
    if max_epochs is not None and 0 < max_epochs <= trainer.current_epoch:
        return f"max_epochs={max_epochs} reached"
    return "the Trainer stopped"


def _headline_metrics(trainer: Trainer) -> list[str]:
    monitored = [
        cb.monitor
        for cb in trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        if isinstance(cb, (EarlyStopping, ModelCheckpoint)) and cb.monitor
    ]
    scores = ["frames", "reward_mean", "val_accuracy", "val_loss", "train_loss", "loss"]
    names = list(dict.fromkeys([*monitored, *scores]))
    if "reward_mean" in trainer.callback_metrics:
        # A GRPO loss is a surrogate whose value is ~0 by construction: reward and accuracy
        # say how the run went.
        names.remove("train_loss")
    shown = []
    for name in names:
        value = trainer.callback_metrics.get(name)
        if value is None or value.numel() != 1 or not math.isfinite(float(value)):
            continue
        number = float(value)
        text = f"{number:,.0f}" if number.is_integer() and abs(number) >= 1000 else f"{number:.4g}"
        shown.append(f"{name} {text}")
    return shown[:4]


def _metrics_file(trainer: Trainer) -> Path | None:
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            logger.save()  # flush what is buffered (an interrupted run has not)
            path = Path(logger.log_dir) / "metrics.csv"
            return path if path.is_file() else None
    return None


def _checkpoint_path(trainer: Trainer) -> str | None:
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            path = callback.last_model_path or callback.best_model_path
            if path:
                return path
    return None


def _with_step(path: str) -> str:
    step = read_run_checkpoint(path).step
    return _relative(path) + (f" (step {step:,})" if step is not None else "")


def _remove_unstarted_run(trainer: Trainer) -> Path | None:
    """Remove the run directory a fit made before its first step, if it holds no checkpoint."""
    for logger in trainer.loggers:
        if not isinstance(logger, CSVLogger):
            continue
        run_dir = Path(logger.log_dir)
        if not run_dir.is_dir() or any(run_dir.rglob("*.ckpt")):
            return None
        shutil.rmtree(run_dir, ignore_errors=True)
        return run_dir
    return None


def _relative(value: Any) -> str:
    text = str(value)
    if os.path.isabs(text):
        try:
            return os.path.relpath(text)
        except ValueError:  # another drive
            return text
    return text
