"""A tiny regression model and buffer filler for the CLI tests (``class_path: cli_toy.X``)."""

from __future__ import annotations

import lightning as L
import torch
from tensordict import TensorDict
from torchrl.data import ReplayBuffer


class Regressor(L.LightningModule):
    """Linear regression of ``y`` on ``x``; counts the items it trained on."""

    def __init__(self, in_features: int = 4, lr: float = 0.1) -> None:
        super().__init__()
        self.net = torch.nn.Linear(in_features, 1)
        self.lr = lr
        self.items_seen = 0

    def training_step(self, batch: TensorDict, batch_idx: int) -> torch.Tensor:
        self.items_seen += batch.shape[0]
        return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def validation_step(self, batch: TensorDict, batch_idx: int) -> None:
        self.log("val_items", float(batch.shape[0]), reduce_fx="sum", batch_size=batch.shape[0])

    def test_step(self, batch: TensorDict, batch_idx: int) -> None:
        self.log("test_items", float(batch.shape[0]), reduce_fx="sum", batch_size=batch.shape[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fill_regression(replay_buffer: ReplayBuffer, n: int = 64, episode_len: int = 8) -> None:
    """``n`` items ``{x, y, ("collector", "traj_ids")}``: episodes of ``episode_len`` items."""
    x = torch.randn(n, 4)
    items = TensorDict(
        {
            "x": x,
            "y": x.sum(-1, keepdim=True),
            "collector": {"traj_ids": torch.arange(n) // episode_len},
        },
        batch_size=[n],
    )
    replay_buffer.extend(items)
