"""Train 'forever' on a buffer that grows each step; checkpoints every few steps.

Run by test_interrupt.py, which sends SIGINT once a checkpoint exists.
Usage: python train_until_interrupted.py CHECKPOINT_DIR
"""

import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataModule


def rows(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict({"id": ids, "obs": ids.float().unsqueeze(-1)}, batch_size=[n])


class GrowingBuffer(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        rb = self.trainer.datamodule.replay_buffer
        rb.extend(rows(rb.write_count, 4))  # like an online collector
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    torch.set_num_threads(1)
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    rb.extend(rows(0, 64))
    trainer = L.Trainer(
        max_steps=10_000_000,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=5, save_last=True)],
    )
    print("training", flush=True)
    trainer.fit(
        GrowingBuffer(), datamodule=ReplayBufferDataModule(rb, batch_size=8, num_batches=None)
    )
    print(f"fit returned at step {trainer.global_step}", flush=True)
