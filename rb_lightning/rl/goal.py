"""``StopAtGoal``: stop when the policy *without exploration* reaches the goal, as ``test`` measures it.

The return of the last training episodes lags (with 16 CartPoles they span ~2,500 steps, in
which a DQN policy can collapse), so it only triggers the module's
:class:`~rb_lightning.rl.Evaluation` episodes; the run stops if their mean reaches the goal
too, as Stable-Baselines3's ``EvalCallback`` does.

Examples:
    >>> goal = StopAtGoal(475.0)
    >>> goal.stop_reason is None  # set when the run stops at the goal
    True
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from rb_lightning.errors import UsageError
from rb_lightning.rl.evaluation import Evaluation

__all__ = ["StopAtGoal"]


class StopAtGoal(Callback):
    """Stop ``fit`` once the greedy evaluation episodes reach ``threshold``.

    The module needs an ``evaluation`` (as DQN and SAC have); ``goal_return`` logs the last
    evaluation's mean. Under DDP a rank at the goal makes every rank evaluate, so all stop
    together.

    Args:
        threshold: The goal: a mean return of at least this (``mode="max"``).
        monitor: The logged training metric that triggers an evaluation when it reaches
            ``threshold`` (checked at each training epoch's end).
        mode: ``"max"`` (higher returns are better) or ``"min"``.
    """

    def __init__(self, threshold: float, monitor: str = "episode_return", mode: str = "max") -> None:
        super().__init__()
        if mode not in ("max", "min"):
            raise UsageError("mode", f"mode must be 'max' or 'min', got {mode!r}.")
        self.threshold = float(threshold)
        self.monitor = monitor
        self.mode = mode
        #: Evaluations played so far, and the mean of the last one.
        self.evaluations = 0
        self.last_return: float | None = None
        #: Why the run stopped, for the run's summary (``None``: not at the goal).
        self.stop_reason: str | None = None

    def _reached(self, value: float) -> bool:
        return value >= self.threshold if self.mode == "max" else value <= self.threshold

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Evaluate the greedy policy when the training return reaches the goal; stop if it does too."""
        metric = trainer.callback_metrics.get(self.monitor)
        trained = math.nan if metric is None else float(metric)
        reached = math.isfinite(trained) and self._reached(trained)
        # Ranks collect their own episodes, so their training returns differ: one rank at the
        # goal makes every rank evaluate (the same weights on the same seeds), and all stop
        # together or none does (a rank stopping alone would hang the others).
        if not trainer.strategy.reduce_boolean_decision(bool(reached), all=False):
            return
        evaluation = getattr(pl_module, "evaluation", None)
        if not isinstance(evaluation, Evaluation):
            raise UsageError(
                "evaluation",
                f"StopAtGoal plays the module's evaluation episodes, but "
                f"{type(pl_module).__name__} has no `evaluation` (rb_lightning.rl.Evaluation). "
                "Give the module one, or stop on the training return with Lightning's "
                "EarlyStopping(monitor=..., stopping_threshold=...).",
            )
        returns = [evaluation.run_episode(pl_module, seed) for seed in evaluation.seeds("validate")]
        self.last_return = sum(returns) / len(returns)
        self.evaluations += 1
        pl_module.log("goal_return", self.last_return, batch_size=1, sync_dist=True)
        if self._reached(self.last_return):
            trainer.should_stop = True
            sign = ">=" if self.mode == "max" else "<="
            self.stop_reason = (
                f"goal reached, greedy return {self.last_return:.2f} {sign} {self.threshold:g} "
                f"over {len(returns)} evaluation episodes (training {self.monitor} "
                f"{trained:.2f})"
            )

    def state_dict(self) -> dict[str, Any]:
        """The evaluations played (a resumed run counts on)."""
        return {"evaluations": self.evaluations, "last_return": self.last_return}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.evaluations = int(state_dict["evaluations"])
        self.last_return = state_dict["last_return"]
