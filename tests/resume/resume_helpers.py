"""Tiny real training runs shared by the resume tests and the fault-test script.

Every item carries an ``id``; items written during training get ids derived
from the step, so two runs that reach the same step write the same items.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensordict import NonTensorStack, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    PrioritizedSampler,
    RandomSampler,
    SamplerWithoutReplacement,
)

# The training scripts run as `python tests/resume/<script>.py` import this module with only
# tests/resume on sys.path; tests/ holds the shared quiet_trainer.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainers import quiet_trainer  # noqa: E402

CAPACITY = 96
INITIAL_ITEMS = 40
FIRST_ONLINE_ID = 10_000


def items(n: int, start: int) -> TensorDict:
    """``n`` items with ids ``start...``; content is a function of the id (no RNG)."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "id": ids,
            "obs": (ids.float() / 1000).unsqueeze(-1).expand(n, 4).clone(),
            "text": NonTensorStack(*[f"item {i}" for i in ids.tolist()]),
        },
        batch_size=[n],
    )


def make_sampler(kind: str) -> Any:
    if kind == "prioritized":
        return PrioritizedSampler(CAPACITY, alpha=0.8, beta=0.5)
    if kind == "without_replacement":
        return SamplerWithoutReplacement()
    return RandomSampler()


def make_buffer(
    sampler: str = "random", *, filled: bool = True, seed: int = 0, capacity: int = CAPACITY
) -> ReplayBuffer:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=make_sampler(sampler),
        generator=torch.Generator().manual_seed(seed),
    )
    if filled:
        rb.extend(items(INITIAL_ITEMS, 0))
    return rb


class Recorder(L.LightningModule):
    """Records the ids of every batch; optionally writes items and updates priorities."""

    def __init__(
        self,
        write_per_step: int = 0,
        update_priority: bool = False,
        delay: float = 0.0,
        prefill: int = 0,
    ) -> None:
        super().__init__()
        self.delay = delay
        self.prefill = prefill
        #: Step and stored ids when training (re)started: what a resume restored.
        self.start_step: int | None = None
        self.start_ids: list[int] = []
        self.net = torch.nn.Linear(4, 1)
        self.write_per_step = write_per_step
        self.update_priority = update_priority
        self.seen: list[list[int]] = []

    def setup(self, stage: str) -> None:
        # Like a script that fills its buffer at start-up; a resume replaces that content.
        rb = self.trainer.datamodule.replay_buffer
        if self.prefill and len(rb) == 0:
            rb.extend(items(self.prefill, 0))

    def on_train_start(self) -> None:
        self.start_step = self.global_step
        self.start_ids = buffer_ids(self.trainer.datamodule.replay_buffer)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch["id"].tolist())
        time.sleep(self.delay)  # the fault test needs a run slow enough to be killed mid-way
        datamodule = self.trainer.datamodule
        if self.write_per_step:
            start = FIRST_ONLINE_ID + self.global_step * self.write_per_step
            datamodule.replay_buffer.extend(items(self.write_per_step, start))
        if self.update_priority:
            datamodule.update_priority(batch, (batch["id"] % 7 + 1).float())
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def make_trainer(
    root: Path, max_steps: int, every: int, *, save_last: bool | str = True, **kwargs: Any
) -> L.Trainer:
    checkpoint = ModelCheckpoint(
        dirpath=Path(root) / "ckpt", save_last=save_last, every_n_train_steps=every
    )
    return quiet_trainer(
        default_root_dir=str(root),
        max_steps=max_steps,
        num_sanity_val_steps=0,
        callbacks=[checkpoint],
        **kwargs,
    )


def online_ids(steps: int, per_step: int) -> list[int]:
    """Ids a :class:`Recorder` writes in its first ``steps`` steps."""
    return list(range(FIRST_ONLINE_ID, FIRST_ONLINE_ID + steps * per_step))


def buffer_ids(rb: ReplayBuffer) -> list[int]:
    """Ids of the stored items, in storage order."""
    return rb[torch.arange(len(rb))]["id"].tolist()
