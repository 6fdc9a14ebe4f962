"""A training run for the fault test: it is SIGKILLed mid-run, then resumed.

Each step writes 2 items with step-derived ids; a checkpoint is written every 2
steps (``last.ckpt`` plus the top-1 rotation), with the buffer beside the .ckpt.

Usage: ``python fault_train.py ROOT``
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch
from resume_helpers import Recorder, make_buffer, make_trainer

from rb_lightning import ReplayBufferDataModule

CAPACITY = 4096
WRITES_PER_STEP = 2


def build(
    root: Path, max_steps: int, *, delay: float = 0.0
) -> tuple[L.Trainer, Recorder, ReplayBufferDataModule]:
    """Trainer, module and DataModule of the run; the resume builds the same."""
    rb = make_buffer(capacity=CAPACITY)
    datamodule = ReplayBufferDataModule(
        rb, batch_size=8, num_batches=None, checkpoint_inline_max_bytes=0
    )
    trainer = make_trainer(root, max_steps, every=2)
    return trainer, Recorder(write_per_step=WRITES_PER_STEP, delay=delay), datamodule


if __name__ == "__main__":
    torch.set_num_threads(1)
    trainer, module, datamodule = build(Path(sys.argv[1]), max_steps=100_000, delay=0.02)
    trainer.fit(module, datamodule=datamodule)
