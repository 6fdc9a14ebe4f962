"""DDP ranks (gloo, CPU), each with its own prioritized buffer, saved on W ranks, resumed on W'.

Run by tests/scale/test_scale_ddp_elastic.py:
``python ddp_elastic.py OUT_DIR WORLD_SIZE TAG MAX_STEPS [CKPT]``. Without CKPT each rank
fills its buffer with ``20 + 5 * rank`` items; every step each rank writes 2 items and sets
its batch's priorities. An item's id is ``TAG * 1_000_000 + rank * 1_000 + n`` and its
priority always ``0.5 + id % 7``, so a restored priority can be checked against the saved
one. A checkpoint is saved every 4 steps (``OUT_DIR/ckpt``). Each rank writes
``OUT_DIR/rank<r>.json``: the ids it held at the start and at the end (storage order), their
priority-tree values, and the ids it drew.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.persist.dumps import dump_buffer
from rb_lightning.torchrl_compat import saved_priority_tree

torch.set_num_threads(1)
CAPACITY = 64


def priority(ids: torch.Tensor) -> torch.Tensor:
    return 0.5 + (ids % 7).float()


def write(rb: ReplayBuffer, ids: torch.Tensor) -> None:
    index = rb.extend(TensorDict({"id": ids, "obs": (ids % 97).float().unsqueeze(-1)}, [len(ids)]))
    rb.update_priority(index, priority(ids))


def held(rb: ReplayBuffer) -> dict[str, list]:
    """Ids in storage order and their priority-tree values (read back from a dump)."""
    ids = rb[torch.arange(len(rb))]["id"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        dump_buffer(rb, Path(tmp) / "dump")
        tree, _ = saved_priority_tree(Path(tmp) / "dump" / "sampler")
    return {"ids": ids, "tree": tree[: len(ids)].tolist()}


class Collector(L.LightningModule):
    """Records each batch, re-sets its priorities and writes 2 items per step."""

    def __init__(self, tag: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.tag = tag
        self.seen: list[list[int]] = []
        self.start: dict[str, list] = {}
        self.start_step = -1

    def on_train_start(self) -> None:
        self.start_step = self.global_step
        self.start = held(self.trainer.datamodule.replay_buffer)

    def training_step(self, batch, batch_idx):
        datamodule = self.trainer.datamodule
        self.seen.append(batch["id"].tolist())
        datamodule.update_priority(batch, priority(batch["id"]))
        first = self.tag * 1_000_000 + self.trainer.global_rank * 1_000 + 100 + 2 * self.global_step
        write(datamodule.replay_buffer, torch.arange(first, first + 2))
        return self.layer(batch["obs"]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(out_dir: Path, world_size: int, tag: int, max_steps: int, ckpt: str | None) -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    L.seed_everything(7)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(CAPACITY),
        sampler=PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.5),
    )
    if ckpt is None:
        write(rb, tag * 1_000_000 + rank * 1_000 + torch.arange(20 + 5 * rank))
    datamodule = ReplayBufferDataModule(rb, batch_size=8, num_batches=None)
    module = Collector(tag)
    trainer = quiet_trainer(
        strategy="ddp",
        devices=world_size,
        max_steps=max_steps,
        callbacks=[
            ModelCheckpoint(dirpath=out_dir / "ckpt", save_last=True, every_n_train_steps=4)
        ],
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    result = {
        "start_step": module.start_step,
        "start": module.start,
        "seen": module.seen,
        "final": held(rb),
        "global_step": trainer.global_step,
    }
    (out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        Path(args[0]), int(args[1]), int(args[2]), int(args[3]), args[4] if len(args) > 4 else None
    )
