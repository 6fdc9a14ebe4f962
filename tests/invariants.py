"""Callbacks that check what a user's code relies on, for any run (added with ``--trainer.callbacks+=``).

``OptimizerOnlyMoves``: every training step starts from the weights the previous step's
optimizer produced. Nothing else (a collector's weight sync, a worker sharing the module's
memory, a checkpoint hook) may move the learner between steps. It records the trainable
parameters at the end of each batch and compares them with those the next batch starts
from; a run with any difference fails at its end with the steps that moved, and writes
them to ``$RB_INVARIANT_REPORT`` (a JSON file) when set, for a test to read.

    python train.py fit --config configs/cartpole_dqn_async.yaml \
        --trainer.callbacks+=invariants.OptimizerOnlyMoves      # tests/ on PYTHONPATH
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer


class OptimizerOnlyMoves(Callback):
    """Fail the run if a step starts from weights other than its optimizer's last output."""

    def __init__(self) -> None:
        super().__init__()
        self._after_last_step: dict[str, torch.Tensor] | None = None
        self.steps_checked = 0
        self.moved_at: list[int] = []

    @staticmethod
    def _weights(pl_module: LightningModule) -> dict[str, torch.Tensor]:
        return {
            name: p.detach().clone() for name, p in pl_module.named_parameters() if p.requires_grad
        }

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._after_last_step is None:
            return
        now = self._weights(pl_module)
        self.steps_checked += 1
        if any(not torch.equal(now[name], w) for name, w in self._after_last_step.items()):
            self.moved_at.append(trainer.global_step)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._after_last_step = self._weights(pl_module)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        report = os.environ.get("RB_INVARIANT_REPORT")
        if report and trainer.is_global_zero:
            with open(report, "w") as f:
                json.dump({"steps_checked": self.steps_checked, "moved_at": self.moved_at}, f)
        if self.moved_at:
            raise AssertionError(
                f"{len(self.moved_at)} of {self.steps_checked} steps started from weights their "
                f"optimizer did not produce (at global steps {self.moved_at[:20]})."
            )
