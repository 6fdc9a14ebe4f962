"""Two DDP ranks (gloo, CPU), each with its own local buffer; writes what each rank drew.

Run by tests/scale/test_scale_ddp.py: ``python ddp_local.py OUT_DIR same|uneven|without``.
Lightning's DDP launcher re-runs this script for rank 1, so everything above ``fit``
runs once per rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule

torch.set_num_threads(1)


class RecordIds(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.ids: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.ids.append(batch["id"].tolist())
        return self.layer(batch["id"].float().unsqueeze(-1)).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(out_dir: Path, mode: str) -> None:
    # The launcher sets LOCAL_RANK for the ranks it starts; the first process is rank 0.
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    L.seed_everything(7)  # the same global seed on both ranks, as users typically do
    size = 200 if mode in ("same", "without") else 100 + 60 * rank
    sampler = SamplerWithoutReplacement() if mode == "without" else None
    rb = ReplayBuffer(storage=LazyTensorStorage(1_000), sampler=sampler)
    rb.extend(TensorDict({"id": torch.arange(size)}, batch_size=[size]))
    if mode == "without":
        # The same 200 items on both ranks, drawn without replacement: 10 batches of 10
        # per rank are one epoch of the buffer between them.
        dm = ReplayBufferDataModule(rb, batch_size=10, num_batches=10)
        limits = {}
    elif mode == "same":
        # An unbounded stream, bounded per rank by limit_train_batches.
        dm = ReplayBufferDataModule(rb, batch_size=10, num_batches=None)
        limits = {"limit_train_batches": 3}
    else:
        # One local buffer's worth per epoch, from buffers of 100 and 160 items.
        dm = ReplayBufferDataModule(rb, batch_size=10)
        limits = {}
    module = RecordIds()
    trainer = quiet_trainer(
        strategy="ddp",
        devices=2,
        max_epochs=2,
        **limits,
    )
    trainer.fit(module, datamodule=dm)
    result = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "batches_served": dm.batches_served,
        "ids": module.ids,
    }
    (out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
