"""100k batches of an unbounded stream, with a buffer being overwritten: memory stays flat."""

from __future__ import annotations

import gc

import psutil
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferBatchDataset, batch_loader

STEPS = 100_000
WARMUP = 10_000


def test_unbounded_stream_rss_is_flat_after_warmup():
    rb = ReplayBuffer(storage=LazyTensorStorage(20_000))
    rb.extend(TensorDict({"obs": torch.randn(20_000, 17), "id": torch.arange(20_000)}, [20_000]))
    refill = TensorDict({"obs": torch.randn(256, 17), "id": torch.arange(256)}, [256])
    process = psutil.Process()
    stream = iter(batch_loader(ReplayBufferBatchDataset(rb, 32, num_batches=None)))
    baseline = None
    for step in range(STEPS):
        batch = next(stream)
        assert batch.batch_size == (32,)
        if step % 100 == 0:
            rb.extend(refill)  # a collector keeps overwriting the ring buffer
        if step == WARMUP:
            gc.collect()
            baseline = process.memory_info().rss
    gc.collect()
    growth = process.memory_info().rss - baseline
    # 90k batches of 32 x 17 floats is ~200 MB of sampled data: a leak of even one
    # reference per batch would show; allow allocator noise only.
    assert growth < 20 * 2**20, (
        f"RSS grew by {growth / 2**20:.1f} MiB over {STEPS - WARMUP} batches"
    )
