"""Two CPU ranks started by ``strategy="ddp_spawn"`` or ``"ddp_notebook"`` (fork), each with a
copy of one prioritized buffer; writes what each rank drew and what it did to its priorities.

Run by tests/scale/test_scale_spawn.py: ``python ddp_spawn_run.py OUT_DIR STRATEGY STEPS
[CKPT]``. Unlike ``ddp``, these strategies do not re-run the script: the buffer built here is
pickled (spawn) or inherited (fork) into each rank, so each rank must get its own copy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule

torch.set_num_threads(1)


class RecordAndPrioritize(L.LightningModule):
    """Records each batch's ids, gives every item the priority ``id % 5 + 1``."""

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.layer = torch.nn.Linear(1, 1)
        self.ids: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.ids.append(batch["id"].tolist())
        self.trainer.datamodule.update_priority(batch, (batch["id"] % 5 + 1).float())
        return self.layer(batch["id"].float().unsqueeze(-1)).mean()

    def on_train_end(self) -> None:  # runs in each rank, where the rank's copy lives
        sampler = self.trainer.datamodule.replay_buffer.sampler
        result = {
            "rank": self.global_rank,
            "world_size": self.trainer.world_size,
            "global_step": self.global_step,
            "ids": self.ids,
            "priority_total": float(sampler._sum_tree.query(0, 100)),
        }
        Path(self.out_dir, f"rank{self.global_rank}.json").write_text(json.dumps(result))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(out_dir: Path, strategy: str, steps: int, ckpt_path: str | None) -> None:
    L.seed_everything(7)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100), sampler=PrioritizedSampler(100, 0.8, 0.5)
    )
    rb.extend(TensorDict({"id": torch.arange(100)}, batch_size=[100]))
    before = float(rb.sampler._sum_tree.query(0, 100))
    trainer = quiet_trainer(
        strategy=strategy,
        devices=2,
        max_steps=steps,
        default_root_dir=str(out_dir),
        callbacks=[ModelCheckpoint(dirpath=out_dir / "ckpt", every_n_train_steps=2, save_top_k=-1)],
    )
    trainer.fit(
        RecordAndPrioritize(str(out_dir)),
        datamodule=ReplayBufferDataModule(rb, 10),
        ckpt_path=ckpt_path,
    )
    # The ranks updated their own copies; this process's buffer is as it was built.
    after = float(rb.sampler._sum_tree.query(0, 100))
    (out_dir / "launcher.json").write_text(json.dumps({"before": before, "after": after}))


if __name__ == "__main__":
    main(
        Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None
    )
