"""2N steps straight vs N + resume + N: the batches after the resume are the same."""

from __future__ import annotations

import pytest
from resume_helpers import (
    Recorder,
    buffer_ids,
    make_buffer,
    make_trainer,
)

from rb_lightning import ReplayBufferDataModule


def _run(tmp_path, sampler, *, steps, every, ckpt_path=None, module=None, fresh_filled=True, **dm):
    rb = make_buffer(sampler, filled=fresh_filled)
    datamodule = ReplayBufferDataModule(rb, batch_size=8, **dm.pop("dm"))
    model = module()
    trainer = make_trainer(tmp_path, steps, every, **dm)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model, rb, trainer


CASES = {
    # One epoch = 5 batches, sampled without read-ahead; resume mid-epoch (step 4 of 5).
    "sized-prioritized-beside": dict(
        sampler="prioritized",
        module=lambda: Recorder(write_per_step=3, update_priority=True),
        dm=dict(num_batches=5, checkpoint_inline_max_bytes=0),
        extra={},
        n=4,
    ),
    # One endless epoch bounded by max_steps only: Lightning reads one batch ahead, and that
    # batch was drawn before the step's writes; the checkpoint carries it.
    "stream-without-replacement-inline": dict(
        sampler="without_replacement",
        module=lambda: Recorder(write_per_step=3),
        dm=dict(num_batches=None),
        extra={},
        n=4,
    ),
    # Three batches per rb.sample call, priorities updated every step: the checkpoint (step 4)
    # carries Lightning's read-ahead (batch 5) and the drawn batch 6, which opens epoch 2.
    "drawn-ahead-prioritized": dict(
        sampler="prioritized",
        module=lambda: Recorder(write_per_step=3, update_priority=True),
        dm=dict(num_batches=5, batches_per_draw=3),
        extra={},
        n=4,
    ),
    # An endless epoch, four batches per draw: Lightning's read-ahead (batch 6) and the
    # drawn batches 7-8 both come back, in that order.
    "drawn-ahead-stream-random": dict(
        sampler="random",
        module=lambda: Recorder(write_per_step=2),
        dm=dict(num_batches=None, batches_per_draw=4),
        extra={},
        n=5,
    ),
    # Epochs of limit_train_batches=3 with online writes, checkpoint on an epoch's last batch.
    "stream-random-epoch-end": dict(
        sampler="random",
        module=lambda: Recorder(write_per_step=2),
        dm=dict(num_batches=None),
        extra=dict(limit_train_batches=3),
        n=3,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resumed_batches_match_straight_run(tmp_path, case):
    spec = CASES[case]
    n = spec["n"]

    def run(root, steps, **kw):
        return _run(
            root,
            spec["sampler"],
            steps=steps,
            every=n,
            module=spec["module"],
            dm=dict(spec["dm"]),
            **spec["extra"],
            **kw,
        )

    straight, straight_rb, straight_trainer = run(tmp_path / "straight", 2 * n)
    first, _, _ = run(tmp_path / "resumed", n)
    # The resumed process starts from an empty buffer: everything must come from the checkpoint.
    resumed, resumed_rb, trainer = run(
        tmp_path / "resumed", 2 * n, ckpt_path="last", fresh_filled=False
    )

    assert first.seen == straight.seen[:n]
    assert resumed.seen == straight.seen[n:]
    assert trainer.global_step == 2 * n
    assert buffer_ids(resumed_rb) == buffer_ids(straight_rb)
    assert resumed_rb.writer._write_count == straight_rb.writer._write_count
    if spec["sampler"] == "prioritized":
        for i in range(len(straight_rb)):
            assert resumed_rb.sampler._sum_tree[i] == straight_rb.sampler._sum_tree[i]
    assert trainer.datamodule.batches_served == straight_trainer.datamodule.batches_served
