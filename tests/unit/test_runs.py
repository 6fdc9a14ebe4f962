"""rb_lightning.runs: latest_checkpoint, FinalLastCheckpoint and RunLogger on a real short fit."""

from __future__ import annotations

import os
import time

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from trainers import LinearOnX, quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.persist.run_dirs import latest_checkpoint
from rb_lightning.runs.run_files import FinalLastCheckpoint, RunLogger


def test_latest_checkpoint_picks_the_newest(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    old = tmp_path / "version_0" / "checkpoints" / "last.ckpt"
    new = tmp_path / "version_1" / "checkpoints" / "last.ckpt"
    for path in (old, new):
        path.parent.mkdir(parents=True)
        path.write_text("x")
    os.utime(old, (time.time() - 100, time.time() - 100))
    assert latest_checkpoint(tmp_path) == new
    extra = tmp_path / "elsewhere" / "last.ckpt"
    extra.parent.mkdir()
    extra.write_text("x")
    assert latest_checkpoint(tmp_path, extra_dirs=[extra.parent]) == extra


def test_final_last_checkpoint_holds_the_last_step_and_logger_writes_metrics(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(TensorDict({"x": torch.arange(16)}, batch_size=[16]))
    checkpoint = FinalLastCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=100)
    assert checkpoint.save_last is True
    logger = RunLogger(save_dir=tmp_path, name="run")
    trainer = quiet_trainer(max_steps=3, callbacks=[checkpoint], logger=logger, log_every_n_steps=1)
    trainer.fit(LinearOnX(), datamodule=ReplayBufferDataModule(rb, batch_size=4, num_batches=None))
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 3
    assert "loss" in (tmp_path / "run" / "version_0" / "metrics.csv").read_text()
