"""rb_lightning.runs.progress: the step bar spans max_steps across epochs."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from trainers import LinearOnX, quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.runs.progress import StepProgressBar


def test_bar_counts_steps_over_epochs():
    rb = ReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(TensorDict({"x": torch.arange(16)}, batch_size=[16]))
    bar = StepProgressBar()
    trainer = quiet_trainer(max_steps=6, callbacks=[bar], enable_progress_bar=True)
    # num_batches=2: three epochs of two steps; the bar must not restart at each.
    trainer.fit(
        LinearOnX(prog_bar=True), datamodule=ReplayBufferDataModule(rb, batch_size=4, num_batches=2)
    )
    assert trainer.current_epoch >= 2
    assert bar.train_progress_bar.total == 6
    assert bar.train_progress_bar.n == 6
    assert "v_num" not in bar.get_metrics(trainer, trainer.lightning_module)


def test_into_a_file_the_bar_is_plain_lines_with_current_values(capsys):
    # Output redirected (CI, a job log): no carriage-return updates, a line every
    # line_every_s seconds (0 here: every step) and a last one with the final values.
    rb = ReplayBuffer(storage=LazyTensorStorage(16))
    rb.extend(TensorDict({"x": torch.arange(16)}, batch_size=[16]))
    bar = StepProgressBar(lines=True, line_every_s=0.0)
    trainer = quiet_trainer(max_steps=4, callbacks=[bar], enable_progress_bar=True)
    trainer.fit(
        LinearOnX(prog_bar=True),
        datamodule=ReplayBufferDataModule(rb, batch_size=4, num_batches=None),
    )
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(" (")[0] for line in lines] == [f"step {n}/4" for n in (1, 2, 3, 4)]
    last = lines[-1]
    assert "(100%)" in last and "steps/s" in last
    assert f"loss={float(trainer.progress_bar_metrics['loss']):.4g}" in last
