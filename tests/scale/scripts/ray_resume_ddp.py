"""Two DDP ranks (gloo, CPU) training on one named Ray buffer, checkpointing every step.

``python ray_resume_ddp.py OUT_DIR RAY_ADDRESS BUFFER_NAME MAX_STEPS [CKPT]``. Every rank
(Lightning's launcher re-runs this script for rank 1) connects to the buffer by name,
writes 2 items per step from rank 0, pushes priority updates from both ranks, and keeps
every checkpoint (save_top_k=-1). With CKPT it resumes; each rank writes what the shared
buffer held when training (re)started to OUT_DIR/rank{r}.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensordict import TensorDict
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.distributed.ray import RayReplayBufferView

torch.set_num_threads(1)
CAPACITY = 200  # the test's buffer capacity


def priorities(rb) -> list[float]:
    """The shared PrioritizedSampler's sum tree (the priorities), read from the actor."""
    # A C++ segment tree: index it (torch.as_tensor on it crashes).
    return rb.state_dict()["_sampler"]["_sum_tree"][torch.arange(CAPACITY)].tolist()


class Prioritize(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.start: dict = {}

    def on_train_start(self) -> None:
        rb = self.trainer.datamodule.replay_buffer
        self.start = {"len": len(rb), "priorities": priorities(rb), "step": self.global_step}

    def training_step(self, batch, batch_idx):
        rb = self.trainer.datamodule.replay_buffer
        if self.global_rank == 0:
            ids = torch.arange(2) + 1_000 + 2 * self.global_step
            rb.extend(TensorDict({"id": ids, "obs": ids.float().unsqueeze(-1)}, batch_size=[2]))
        # Rank-tagged priorities, so both ranks' updates are in the saved sampler.
        priority = (batch["id"] % 7 + 1 + 10 * self.global_rank).float()
        self.trainer.datamodule.update_priority(batch, priority)
        return self.layer(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def main(out_dir: Path, address: str, name: str, max_steps: int, ckpt: str | None) -> None:
    buffer = RayReplayBufferView(name, address=address, ray_init_config={"log_to_driver": False})
    dm = ReplayBufferDataModule(buffer, batch_size=8, num_batches=None)
    module = Prioritize()
    trainer = quiet_trainer(
        strategy="ddp",
        devices=2,
        max_steps=max_steps,
        limit_train_batches=100,
        default_root_dir=str(out_dir),
        callbacks=[
            ModelCheckpoint(
                dirpath=out_dir / "ckpt", save_last=True, save_top_k=-1, every_n_train_steps=1
            )
        ],
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt)
    result = {"rank": trainer.global_rank, **module.start}
    (out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]), args[1], args[2], int(args[3]), args[4] if len(args) > 4 else None)
