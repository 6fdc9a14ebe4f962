"""Two DDP ranks (gloo, CPU) sampling one Ray-backed prioritized buffer that a collector fills.

``python ray_ddp.py OUT_DIR RAY_ADDRESS BUFFER_NAME TOTAL_ITEMS``. Every rank (Lightning's
launcher re-runs this script for rank 1) connects to the buffer by name, trains while the
collector writes, pushes priority updates, and writes what it drew to OUT_DIR/rank{r}.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning as L
import torch
from tensordict import TensorDict
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.distributed.ray import RayReplayBufferView

torch.set_num_threads(1)

#: Rank r boosts this storage index to a priority no other item has.
BOOSTED_INDEX = 10


class SampleAndPrioritize(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.ids: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.ids.append(batch["id"].tolist())
        error = self.layer(batch["obs"]).squeeze(-1) - batch["id"].float()
        # The usual update: |error| per sampled item, sent to the shared sampler.
        self.trainer.datamodule.update_priority(batch, error.abs() + 1e-3)
        return (batch["priority_weight"] * error.pow(2)).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def main(out_dir: Path, address: str, name: str, total: int) -> None:
    buffer = RayReplayBufferView(name, address=address, ray_init_config={"log_to_driver": False})
    dm = ReplayBufferDataModule(buffer, batch_size=16, num_batches=None, min_size=64)
    module = SampleAndPrioritize()
    trainer = quiet_trainer(
        strategy="ddp",
        devices=2,
        max_epochs=2,
        limit_train_batches=3,
    )
    trainer.fit(module, datamodule=dm)
    rank = trainer.global_rank
    # Once the collector is done, each rank boosts one index of its own: both must
    # show up in the owner's sampler for the test to pass.
    deadline = time.monotonic() + 60
    while len(buffer) < total and time.monotonic() < deadline:
        time.sleep(0.1)
    index = torch.tensor([BOOSTED_INDEX + rank])
    # Far above any training priority: the untrained layer's errors reach ~1e7, and items the
    # collector wrote after such an update got that as their (max) priority.
    dm.update_priority(TensorDict({"index": index}, batch_size=[1]), torch.tensor([1e12]))
    result = {"rank": rank, "global_step": trainer.global_step, "ids": module.ids}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]))
