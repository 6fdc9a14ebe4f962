"""The speed-ups behind benchmarks/throughput.py keep the loaders' behaviour."""

from __future__ import annotations

import gc
import pickle
import weakref

import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter
from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

from rb_lightning import ReplayBufferBatchDataset, batch_loader, keep_batch


def _buffer(sampler=None) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler)
    rb.extend(TensorDict({"id": torch.arange(64), "obs": torch.randn(64, 3)}, batch_size=[64]))
    return rb


def _ids(loader) -> tuple[list[list[int]], torch.Tensor]:
    torch.manual_seed(0)
    ids = [batch["id"].tolist() for batch in loader]
    return ids, torch.rand(3)  # the global RNG state after the pass


def test_batch_loader_draws_what_a_plain_dataloader_draws():
    rb = _buffer()  # no generator of its own: samples from the global RNG
    fast = batch_loader(ReplayBufferBatchDataset(rb, 8, num_batches=4))
    plain = DataLoader(
        ReplayBufferBatchDataset(rb, 8, num_batches=4), batch_size=None, collate_fn=keep_batch
    )
    fast_ids, fast_rng = _ids(fast)
    plain_ids, plain_rng = _ids(plain)
    assert fast_ids == plain_ids and len(fast_ids) == 4
    assert torch.equal(fast_rng, plain_rng)
    # In-process loading skips torch's per-batch iterator machinery; workers keep it.
    assert not isinstance(iter(fast), _BaseDataLoaderIter)
    assert isinstance(iter(plain), _BaseDataLoaderIter)


def test_in_flight_iterator_pickles_as_an_empty_one():
    iterator = iter(batch_loader(ReplayBufferBatchDataset(_buffer(), 8, num_batches=3)))
    next(iterator)
    assert list(pickle.loads(pickle.dumps(iterator))) == []
    assert len(list(iterator)) == 2


def test_sampler_info_on_every_batch_only_when_the_sampler_weighs():
    prioritized = _buffer(PrioritizedSampler(64, alpha=0.7, beta=0.5))
    batches = list(batch_loader(ReplayBufferBatchDataset(prioritized, 8, num_batches=3)))
    for batch in batches:
        assert torch.equal(batch["index"], batch["id"])
        assert batch["priority_weight"].shape == (8,)
    plain = list(batch_loader(ReplayBufferBatchDataset(_buffer(), 8, num_batches=3)))
    assert all(set(batch.keys()) == {"id", "obs"} for batch in plain)


def test_a_bare_loader_keeps_no_batch_alive():
    """Peak memory of one batch, like a bare rb.sample loop: the loader holds no batch it
    handed out, neither in its read-ahead record nor while it samples the next one."""
    handed_out: list[weakref.ref] = []
    alive_while_sampling: list[bool] = []

    def probe(batch):  # runs inside rb.sample, on the batch being drawn
        gc.collect()
        alive_while_sampling.append(any(ref() is not None for ref in handed_out))
        return batch

    rb = _buffer()
    rb.append_transform(probe)
    iterator = iter(batch_loader(ReplayBufferBatchDataset(rb, 8, num_batches=None)))
    for _ in range(4):
        handed_out.append(weakref.ref(next(iterator)["obs"]))
    assert alive_while_sampling == [False] * 4
