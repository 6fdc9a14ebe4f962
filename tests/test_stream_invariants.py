"""Invariants of the sampled stream, over samplers, DataLoader workers and sizes (``hypothesis``).

What a user's code relies on, whatever the sampler and the number of workers:

* every batch comes from the buffer (each item is a stored one, its columns together);
* a sampler without replacement draws each item once per epoch *across workers*: the
  workers deal out one order, as one process would draw it (before, each worker permuted
  its own copy: 7,493 unique items of 10,000 with 2 workers);
* ``batches_served`` counts the batches the loop took.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
)

from rb_lightning import ReplayBufferBatchDataset, batch_loader

SAMPLERS = ["random", "without_replacement", "prioritized", "slice"]


def _buffer(sampler: str, size: int) -> ReplayBuffer:
    make = {
        "random": RandomSampler,
        "without_replacement": SamplerWithoutReplacement,
        "prioritized": lambda: PrioritizedSampler(size, alpha=0.7, beta=0.5),
        "slice": lambda: SliceSampler(slice_len=2, traj_key="episode"),
    }[sampler]
    rb = ReplayBuffer(storage=LazyTensorStorage(size), sampler=make())
    ids = torch.arange(size)
    rb.extend(TensorDict({"id": ids, "twice": 2 * ids, "episode": ids // 4}, batch_size=[size]))
    return rb


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sampler=st.sampled_from(SAMPLERS),
    num_workers=st.integers(0, 3),
    batch_half=st.integers(1, 12),
    episodes=st.integers(2, 30),
    data=st.data(),
)
def test_batches_come_from_the_buffer_and_epochs_draw_each_item_once(
    sampler, num_workers, batch_half, episodes, data
):
    size, batch_size = 4 * episodes, 2 * batch_half  # whole episodes, slices of 2
    rb = _buffer(sampler, size)
    epoch = math.ceil(size / batch_size)
    num_batches = data.draw(st.integers(1, epoch + 3), label="num_batches")
    dataset = ReplayBufferBatchDataset(rb, batch_size, num_batches=num_batches)
    context = {"multiprocessing_context": "fork"} if num_workers else {}
    batches = [b for b in batch_loader(dataset, num_workers=num_workers, **context)]
    assert len(batches) == num_batches
    for batch in batches:
        assert torch.equal(batch["twice"], 2 * batch["id"]), "columns of different items"
        assert 0 <= int(batch["id"].min()) and int(batch["id"].max()) < size
    if num_workers == 0:
        assert dataset.batches_served == num_batches
    if sampler == "without_replacement":
        drawn = [i for batch in batches[:epoch] for i in batch["id"].tolist()]
        assert len(drawn) == len(set(drawn)), "an item drawn twice within an epoch"
        if num_batches >= epoch:
            assert sorted(drawn) == list(range(size)), "an item missed by an epoch"


def test_workers_deal_out_the_order_of_one_process():
    # 10,000 items, batches of 100, one epoch: every item exactly once, with 0-3 workers.
    for num_workers in (0, 2, 3):
        rb = _buffer("without_replacement", 10_000)
        dataset = ReplayBufferBatchDataset(rb, 100, num_batches=100)
        context = {"multiprocessing_context": "fork"} if num_workers else {}
        ids = torch.cat(
            [b["id"] for b in batch_loader(dataset, num_workers=num_workers, **context)]
        )
        assert len(ids) == 10_000 and len(set(ids.tolist())) == 10_000, num_workers
