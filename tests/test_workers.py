"""DataLoader workers: an epoch is split across workers, and each worker draws its own stream.

Each spawned worker re-imports torch and torchrl (seconds on 2 cores), so every loader
started here is checked for several properties at once, and the workers start from a
forkserver that imported them once (tests/conftest.py; the dataset is pickled as under spawn).
"""

from __future__ import annotations

import pytest
import torch
from rb_testdata import make_transitions
from torch.utils.data import DataLoader
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferBatchDataset, ReplayBufferDataset, batch_loader

pytestmark = pytest.mark.usefixtures("workers_from_a_forkserver")


def _rb(seeded: bool) -> ReplayBuffer:
    generator = torch.Generator().manual_seed(0) if seeded else None
    rb = ReplayBuffer(storage=LazyTensorStorage(2_000), generator=generator)
    rb.extend(make_transitions(2_000))
    return rb


def _draw_with_two_workers() -> list[tuple[int, ...]]:
    torch.manual_seed(123)
    # A buffer with its own seeded generator: naive copies in each worker would draw
    # identical batches; re-seeding per worker must make them differ.
    dataset = ReplayBufferBatchDataset(_rb(seeded=True), 64, keys=["id"], num_batches=5)
    return [tuple(b["id"].tolist()) for b in batch_loader(dataset, num_workers=2)]


def test_two_workers_split_the_epoch_draw_different_and_reproducible_streams():
    first = _draw_with_two_workers()
    assert len(first) == 5  # not 2 x 5
    assert len(set(first)) == 5, "two workers drew the same batch"
    # Same global seed: the same per-worker streams.
    assert _draw_with_two_workers() == first


def test_per_item_mode_with_workers_keeps_total_count():
    dataset = ReplayBufferDataset(_rb(seeded=False), 8, keys=["id"], num_batches=3)
    items = list(DataLoader(dataset, batch_size=None, num_workers=2))
    assert len(items) == 24
