"""Exact resume with DataLoader workers: each worker's stream is rebuilt from the checkpoint.

A worker's stream is a function of (stream seed, epoch, rank, role); the checkpoint
records the seed, the epoch and the batches the loop took, and the resumed workers
redraw what was taken before it. The buffer is not written during these runs: with
concurrent writes, what a worker draws depends on timing even without a resume.
"""

from __future__ import annotations

import pytest
import torch
from resume_helpers import buffer_ids, make_buffer, make_trainer
from test_resume_user_hooks import ValueRecorder

from rb_lightning import ReplayBufferDataModule

# Workers from a forkserver (tests/conftest.py): each of a case's ~10 worker starts spent
# seconds importing torch and rb_lightning under spawn.
pytestmark = pytest.mark.usefixtures("workers_from_a_forkserver")

CASES = {
    # 5-batch epochs, resumed at batch 3 of the first: an odd position, so the resumed
    # workers play each other's roles; the second epoch starts after the resume.
    "sized-mid-epoch": dict(dm=dict(num_batches=5), n=3),
    # Persistent workers and an unbounded stream: workers read ahead several batches.
    "stream-persistent": dict(dm=dict(num_batches=None, persistent_workers=True), n=4),
    # Without replacement, the workers deal out one order: 40 items are 5 batches of 8.
    "without-replacement-mid-epoch": dict(
        dm=dict(num_batches=5), n=3, sampler="without_replacement"
    ),
    "without-replacement-stream": dict(
        dm=dict(num_batches=None, persistent_workers=True), n=4, sampler="without_replacement"
    ),
}


def _run(root, spec, steps, *, ckpt_path=None, filled=True):
    rb = make_buffer(spec.get("sampler", "random"), filled=filled)
    datamodule = ReplayBufferDataModule(rb, batch_size=8, num_workers=2, **spec["dm"])
    model = ValueRecorder()
    trainer = make_trainer(root, steps, spec["n"])
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model, rb, trainer


@pytest.mark.parametrize("case", list(CASES))
def test_two_workers_resume_exactly(tmp_path, case):
    spec = CASES[case]
    n = spec["n"]
    torch.manual_seed(0)
    straight, straight_rb, straight_trainer = _run(tmp_path / "straight", spec, 2 * n)
    torch.manual_seed(0)
    first, _, _ = _run(tmp_path / "resumed", spec, n)
    torch.manual_seed(1)  # the resumed process's global RNG plays no part
    resumed, resumed_rb, trainer = _run(
        tmp_path / "resumed", spec, 2 * n, ckpt_path="last", filled=False
    )

    assert first.seen == straight.seen[:n]
    if spec.get("sampler") == "without_replacement":  # each of the 40 items once per 5 batches
        for epoch in range(0, 2 * n - 4, 5):
            items = [i for batch in straight.seen[epoch : epoch + 5] for i in batch]
            assert sorted(items) == list(range(40)), f"epoch at batch {epoch}"
    assert len(set(map(tuple, straight.seen))) == 2 * n, "two workers drew the same batch"
    assert resumed.start_step == n and len(resumed.seen) == n
    for step, (ids, values) in enumerate(zip(resumed.seen, resumed.values, strict=True)):
        assert ids == straight.seen[n + step], f"batch {n + step} differs after the resume"
        assert torch.equal(values, straight.values[n + step])
    assert buffer_ids(resumed_rb) == buffer_ids(straight_rb)
    assert trainer.datamodule.batches_served == straight_trainer.datamodule.batches_served
