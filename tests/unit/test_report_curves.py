"""RunReport warns, once at the end of fit, about a requested curve that the run never logged."""

from __future__ import annotations

import warnings

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from trainers import LinearOnX, quiet_trainer

from rb_lightning import ReplayBufferDataModule, RunLogger, RunReport


def _fit(tmp_path, curves: list[str], steps: int = 4) -> list[str]:
    rb = ReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(TensorDict({"x": torch.arange(16)}, batch_size=[16]))
    trainer = quiet_trainer(
        max_steps=steps,
        log_every_n_steps=2,
        logger=RunLogger(save_dir=tmp_path, name="toy"),
        callbacks=[RunReport(curves=curves, draw=False)],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            LinearOnX(), datamodule=ReplayBufferDataModule(rb, batch_size=4, num_batches=None)
        )
    return [str(w.message) for w in caught if "RunReport(curves=...)" in str(w.message)]


def test_a_curve_never_logged_is_named_once_with_what_was_logged(tmp_path):
    (message,) = _fit(tmp_path, ["loss", "critic_loss"])
    assert "['critic_loss']" in message and "never logged" in message
    assert "'loss'" in message.split("The run logged:")[1]  # what to name instead
    assert _fit(tmp_path, ["loss"]) == []


def test_a_run_shorter_than_its_logging_interval_is_not_warned_about(tmp_path):
    assert _fit(tmp_path, ["critic_loss"], steps=1) == []
