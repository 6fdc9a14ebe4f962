"""Resume stays exact when the user overrides the batch hooks without calling super().

The stream position is the train loader's checkpointed state (Lightning saves and
restores it), counted from Lightning's own progress, so no hook takes part in it.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from resume_helpers import Recorder, buffer_ids, make_buffer, make_trainer

from rb_lightning import ReplayBufferDataModule


class UserHooks(ReplayBufferDataModule):
    """Batch hooks written the way many Lightning users write them: no super()."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        return batch.to(device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch


class ValueRecorder(Recorder):
    """Also records the values of each batch, not just the ids."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.values: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.values.append(batch["obs"].clone())
        return super().training_step(batch, batch_idx)


CASES = {
    # Epochs of 5 batches; the checkpoint at step 4 is mid-epoch, where Lightning warns
    # about loaders without state.
    "sized-prioritized": dict(
        sampler="prioritized",
        module=dict(write_per_step=3, update_priority=True),
        dm=dict(num_batches=5),
        n=4,
        extra={},
    ),
    # An endless epoch: Lightning has read batch n+1 (drawn before step n's writes) when
    # the checkpoint at step n is saved.
    "stream-without-replacement-beside": dict(
        sampler="without_replacement",
        module=dict(write_per_step=2),
        dm=dict(num_batches=None, checkpoint_inline_max_bytes=0),
        n=5,
        extra={},
    ),
    # Epochs of 4 batches from an unbounded stream (limit_train_batches), resumed mid-epoch.
    "stream-random-limited": dict(
        sampler="random",
        module=dict(write_per_step=1),
        dm=dict(num_batches=None),
        n=6,
        extra=dict(limit_train_batches=4),
    ),
}


def _run(root, spec, steps, *, ckpt_path=None, filled=True):
    rb = make_buffer(spec["sampler"], filled=filled)
    datamodule = UserHooks(rb, batch_size=8, **spec["dm"])
    model = ValueRecorder(**spec["module"])
    trainer = make_trainer(root, steps, spec["n"], **spec["extra"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model, rb, trainer, [str(w.message) for w in caught]


@pytest.mark.parametrize("case", list(CASES))
def test_user_hooks_without_super_resume_exactly(tmp_path, case):
    spec = CASES[case]
    n = spec["n"]
    straight, straight_rb, straight_trainer, _ = _run(tmp_path / "straight", spec, 2 * n)
    first, _, _, _ = _run(tmp_path / "resumed", spec, n)
    resumed, resumed_rb, trainer, messages = _run(
        tmp_path / "resumed", spec, 2 * n, ckpt_path="last", filled=False
    )

    assert resumed.start_step == n
    assert first.seen == straight.seen[:n]
    # Batch by batch after the resume: the same items with the same values.
    assert len(resumed.seen) == n
    for step, (ids, values) in enumerate(zip(resumed.seen, resumed.values, strict=True)):
        assert ids == straight.seen[n + step], f"batch {n + step} differs after the resume"
        assert torch.equal(values, straight.values[n + step])
    assert buffer_ids(resumed_rb) == buffer_ids(straight_rb)
    if spec["sampler"] == "prioritized":
        for i in range(len(straight_rb)):
            assert resumed_rb.sampler._sum_tree[i] == straight_rb.sampler._sum_tree[i]
    assert trainer.datamodule.batches_served == straight_trainer.datamodule.batches_served
    assert not [m for m in messages if "not resumable" in m], messages


def test_the_stream_position_is_saved_once_in_the_datamodules_state(tmp_path):
    # The loader is a stateful one to Lightning (no "not resumable" warning) but stores
    # nothing: the position is the DataModule's, saved with its buffer, as plain ints a
    # weights-only load accepts.
    spec = CASES["sized-prioritized"]
    _run(tmp_path, spec, spec["n"])
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    (loader_state,) = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert loader_state == {}
    (stream,) = [v["stream"] for v in checkpoint.values() if isinstance(v, dict) and "stream" in v]
    assert stream["epoch"] == 0 and stream["position"] == 4 and stream["batches_served"] == 4
    assert all(isinstance(v, int) for v in stream.values())
