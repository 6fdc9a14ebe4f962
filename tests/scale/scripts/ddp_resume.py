"""Two DDP ranks (gloo, CPU), each collecting rank-tagged items into its own buffer.

Run by tests/scale/test_scale_ddp_resume.py:
``python ddp_resume.py OUT_DIR MAX_STEPS [CKPT]``. Every 4 steps a checkpoint is saved
(``OUT_DIR/ckpt``); with CKPT the run resumes from it into empty buffers. Each rank
writes what it drew and held to ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule

torch.set_num_threads(1)
RANK_TAG = 100_000  # item ids are rank * RANK_TAG + n


def tagged(rank: int, start: int, n: int) -> TensorDict:
    ids = rank * RANK_TAG + torch.arange(start, start + n)
    return TensorDict({"id": ids, "obs": ids.float().unsqueeze(-1) / 1e5}, batch_size=[n])


def buffer_ids(rb: ReplayBuffer) -> list[int]:
    return rb[torch.arange(len(rb))]["id"].tolist()


class Collector(L.LightningModule):
    """Records each batch and writes 2 rank-tagged items per step into its rank's buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []
        self.start_ids: list[int] = []
        self.start_step = -1

    def on_train_start(self) -> None:
        self.start_step = self.global_step
        self.start_ids = buffer_ids(self.trainer.datamodule.replay_buffer)

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["id"].tolist())
        rank = self.trainer.global_rank
        self.trainer.datamodule.replay_buffer.extend(tagged(rank, 1_000 + 2 * self.global_step, 2))
        return self.layer(batch["obs"]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(out_dir: Path, max_steps: int, ckpt: str | None) -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    L.seed_everything(7)
    rb = ReplayBuffer(storage=LazyTensorStorage(256))
    if ckpt is None:
        rb.extend(tagged(rank, 0, 40 + 10 * rank))  # uneven local buffers
    datamodule = ReplayBufferDataModule(rb, batch_size=8, num_batches=None)
    module = Collector()
    trainer = quiet_trainer(
        strategy="ddp",
        devices=2,
        max_steps=max_steps,
        callbacks=[
            ModelCheckpoint(dirpath=out_dir / "ckpt", save_last=True, every_n_train_steps=4)
        ],
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    result = {
        "rank": trainer.global_rank,
        "start_step": module.start_step,
        "start_ids": module.start_ids,
        "seen": module.seen,
        "final_ids": buffer_ids(rb),
        "global_step": trainer.global_step,
    }
    (out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
