"""Chunked saves through a real Trainer: 2N steps straight vs N + resume + N, batch by batch.

``BufferCheckpointIO(incremental=True)`` (the buffer written in a writer thread), with and
without Lightning's ``AsyncCheckpointIO`` below it. A ``PrioritizedSampler`` updated every
step and a buffer that wraps between saves; ``ModelCheckpoint`` keeps one step checkpoint
and ``last.ckpt``, so every save also rotates one out.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from resume_helpers import CAPACITY, INITIAL_ITEMS, Recorder, buffer_ids, make_buffer, make_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist.manifest import CHUNKS_DIR, MANIFEST

N, EVERY, WRITES = 8, 4, 8  # saves at steps 4, 8 (wrapped by then), 12, 16


def _run(root: Path, steps: int, io: str, *, ckpt_path=None, filled=True):
    rb = make_buffer("prioritized", filled=filled)
    datamodule = ReplayBufferDataModule(
        rb, batch_size=8, num_batches=5, checkpoint_inline_max_bytes=0
    )
    plugin = BufferCheckpointIO(AsyncCheckpointIO() if io == "async" else None, incremental=True)
    model = Recorder(write_per_step=WRITES, update_priority=True)
    trainer = make_trainer(root, steps, EVERY, plugins=[plugin])
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model, rb, trainer


def _manifest(checkpoint: Path) -> dict:
    (version,) = Path(f"{checkpoint}.buffer").iterdir()
    return json.loads((version / MANIFEST).read_text())


@pytest.mark.parametrize("io", ["sync", "async"])
def test_chunked_resume_matches_straight_run(tmp_path, io):
    assert INITIAL_ITEMS + N * WRITES > CAPACITY  # the buffer wraps before the resume
    straight, straight_rb, _ = _run(tmp_path / "straight", 2 * N, io)
    first_seen = _run(tmp_path / "resumed", N, io)[0].seen
    # The first process ends here: its buffer, whose last save it kept chunks for, is gone
    # (a ReplayBuffer sits in reference cycles, freed by a collection).
    gc.collect()
    resumed, resumed_rb, trainer = _run(
        tmp_path / "resumed", 2 * N, io, ckpt_path="last", filled=False
    )

    assert first_seen == straight.seen[:N]
    assert resumed.seen == straight.seen[N:]
    assert trainer.global_step == 2 * N
    assert buffer_ids(resumed_rb) == buffer_ids(straight_rb)
    assert resumed_rb.writer._write_count == straight_rb.writer._write_count
    for i in range(CAPACITY):
        assert resumed_rb.sampler._sum_tree[i] == straight_rb.sampler._sum_tree[i]

    checkpoints = tmp_path / "resumed" / "ckpt"
    kept = sorted(p.name for p in checkpoints.glob("*.ckpt"))
    assert kept == ["epoch=3-step=16.ckpt", "last.ckpt"]  # save_top_k=1 rotated the others out
    # The resumed run's saves wrote only its own rows (the buffer it loaded is its base), and
    # last.ckpt, saved right after the step checkpoint, none.
    assert _manifest(checkpoints / "epoch=3-step=16.ckpt")["changed_rows"] == EVERY * WRITES
    assert _manifest(checkpoints / "last.ckpt")["changed_rows"] == 0
    listed = set()
    for name in kept:
        listed |= set(_manifest(checkpoints / name)["chunks"])
    assert {p.name for p in (checkpoints / CHUNKS_DIR).iterdir()} == listed
