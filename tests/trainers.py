"""One quiet ``lightning.Trainer`` for tests (CPU, no logger, progress bar, model summary or
checkpoints), and the smallest model that logs a loss.

``quiet_trainer(max_steps=8, callbacks=[...])`` in a test file (``tests/`` is on
``sys.path``: ``from trainers import quiet_trainer``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint


def quiet_trainer(**overrides: Any) -> L.Trainer:
    """``L.Trainer(**overrides)`` with the quiet defaults above; any of them can be overridden.

    Checkpointing is on only when ``callbacks`` holds a checkpoint callback
    (``ModelCheckpoint``), which Lightning refuses with ``enable_checkpointing=False``.
    """
    callbacks = overrides.get("callbacks") or []
    defaults: dict[str, Any] = dict(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=any(isinstance(c, Checkpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**defaults, **overrides})


class LinearOnX(L.LightningModule):
    """One ``Linear(1, 1)`` on the batch's ``"x"`` column that logs ``loss`` (lr 0: weights stay).

    Args:
        prog_bar: Also show ``loss`` on the progress bar.
    """

    def __init__(self, prog_bar: bool = False) -> None:
        super().__init__()
        self.prog_bar = prog_bar
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch["x"].float().unsqueeze(-1)).mean()
        self.log("loss", loss, prog_bar=self.prog_bar)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)
