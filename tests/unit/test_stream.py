"""BufferStream: seeding, waiting, and draws equal to ``rb.sample(B, return_info=True)``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from rb_testdata import make_transitions
from tensordict import TensorDict, TensorDictBase
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorDictRoundRobinWriter,
)
from torchrl.envs.transforms import Compose, RenameTransform

from rb_lightning import ReplayBufferBatchDataset, batch_loader
from rb_lightning.stream.sampling import SAMPLER_INFO_KEYS, BufferStream
from rb_lightning.stream.sharding import Shard
from rb_lightning.torchrl_compat import supports_direct_sampling


def _previous_draw(rb: ReplayBuffer, batch_size: int) -> TensorDictBase:
    """What the datasets drew before BufferStream (rb_lightning 0.1.0's ``_draw``)."""
    batch, info = rb.sample(batch_size, return_info=True)
    extra = {k: info[k] for k in SAMPLER_INFO_KEYS if k in info and k not in batch.keys()}
    if "priority_weight" in extra:
        for name, value in extra.items():
            batch.set(name, torch.as_tensor(value, device=batch.device))
    return batch


def _buffer(storage: str, sampler: str, tmp_path, **kwargs) -> ReplayBuffer:
    size = 300
    storages = {
        "tensor": lambda: LazyTensorStorage(size),
        "memmap": lambda: LazyMemmapStorage(size, scratch_dir=tmp_path),
        "list": lambda: ListStorage(size),
    }
    samplers = {
        "prioritized": lambda: PrioritizedSampler(size, alpha=0.7, beta=0.5),
        "random": RandomSampler,
    }
    buffer_class = kwargs.pop("buffer_class", ReplayBuffer)
    stored_info = kwargs.pop("stored_info", False)
    rb = buffer_class(storage=storages[storage](), sampler=samplers[sampler](), **kwargs)
    torch.manual_seed(0)
    data = make_transitions(200)
    if stored_info:  # items that already carry the info keys (e.g. stored from a sample)
        data["index"] = torch.full((200,), -1)
        data["priority_weight"] = torch.zeros(200)
    if storage == "list":
        for i in range(len(data)):
            rb.add(data[i])
    else:
        rb.extend(data)
    if sampler == "prioritized":
        rb.update_priority(torch.arange(200), torch.rand(200) + 0.1)  # not all equal
    return rb


def _assert_same(a: TensorDictBase, b: TensorDictBase) -> None:
    assert sorted(map(str, a.keys(True, True))) == sorted(map(str, b.keys(True, True)))
    for key in a.keys(True, True):
        assert torch.equal(a[key], b[key]), key
        assert a[key].dtype == b[key].dtype, key


CASES = [
    ("tensor", "prioritized", {}),
    ("memmap", "prioritized", {}),
    ("list", "prioritized", {}),
    ("tensor", "random", {}),
    # The full rb.sample path: a transform, and a TensorDictReplayBuffer (sets the info itself).
    ("tensor", "prioritized", {"transform": Compose(RenameTransform(["obs"], ["observation"]))}),
    ("tensor", "prioritized", {"buffer_class": TensorDictReplayBuffer}),
    # Stored info keys: a TensorDictReplayBuffer replaces them, a plain buffer keeps them.
    ("tensor", "prioritized", {"buffer_class": TensorDictReplayBuffer, "stored_info": True}),
    ("tensor", "prioritized", {"stored_info": True}),
]


@pytest.mark.parametrize(("storage", "sampler", "kwargs"), CASES)
@pytest.mark.parametrize("own_generator", [True, False])
def test_draws_equal_the_previous_path_for_the_same_generator_state(
    storage, sampler, kwargs, own_generator, tmp_path
):
    rb = _buffer(storage, sampler, tmp_path, **dict(kwargs))
    stream = BufferStream(rb, batch_size=16)

    def seed(value: int) -> None:
        if own_generator:
            rb.set_rng(torch.Generator().manual_seed(value))
        else:  # the buffer samples from the global RNGs (numpy's for PrioritizedSampler)
            torch.manual_seed(value)
            np.random.seed(value)

    if own_generator:
        stream.reseed(0)
    for step in range(4):  # the first draw decides the path, the next ones take it
        seed(step)
        expected = _previous_draw(rb, 16)
        seed(step)
        _assert_same(stream.sample(), expected)
    assert stream.batches_drawn == 4


def test_direct_sampling_is_taken_only_where_rb_sample_adds_nothing(tmp_path):
    assert supports_direct_sampling(_buffer("tensor", "prioritized", tmp_path))
    assert supports_direct_sampling(_buffer("memmap", "prioritized", tmp_path))
    assert not supports_direct_sampling(_buffer("list", "prioritized", tmp_path))
    assert not supports_direct_sampling(_buffer("tensor", "random", tmp_path))
    transform = Compose(RenameTransform(["obs"], ["observation"]))
    assert not supports_direct_sampling(
        _buffer("tensor", "prioritized", tmp_path, transform=transform)
    )
    assert supports_direct_sampling(
        _buffer("tensor", "prioritized", tmp_path, buffer_class=TensorDictReplayBuffer)
    )
    # A writer tracking generations: TensorDictReplayBuffer.sample also sets index_generation.
    assert not supports_direct_sampling(
        _buffer(
            "tensor",
            "prioritized",
            tmp_path,
            buffer_class=TensorDictReplayBuffer,
            writer=TensorDictRoundRobinWriter(track_generations=True),
        )
    )
    subclass = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(9))
    subclass.extend(make_transitions(4))
    assert not supports_direct_sampling(subclass)
    assert not supports_direct_sampling(
        _buffer("tensor", "prioritized", tmp_path, collate_fn=lambda x: x)
    )
    assert not supports_direct_sampling(
        _buffer("tensor", "prioritized", tmp_path, prefetch=2, batch_size=4)
    )


def test_batch_dataset_yields_what_the_previous_path_drew(tmp_path):
    rb = _buffer("tensor", "prioritized", tmp_path)
    rb.set_rng(torch.Generator().manual_seed(3))
    expected = [_previous_draw(rb, 8) for _ in range(3)]
    rb.set_rng(torch.Generator().manual_seed(3))
    got = list(batch_loader(ReplayBufferBatchDataset(rb, 8, num_batches=3)))
    for a, b in zip(got, expected, strict=True):
        _assert_same(a, b)


def test_priorities_updated_between_draws_are_seen(tmp_path):
    rb = _buffer("tensor", "prioritized", tmp_path)
    stream = BufferStream(rb, batch_size=64)
    stream.sample()
    rb.update_priority(torch.arange(200), torch.full((200,), 1e-6))
    rb.update_priority(torch.tensor([7]), torch.tensor([1e6]))
    assert (stream.sample()["index"] == 7).all()


def test_seed_replica_gives_copies_their_own_stream_and_leaves_a_single_process_alone():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), generator=torch.Generator().manual_seed(1))
    rb.extend(TensorDict({"x": torch.arange(100)}, batch_size=[100]))
    generator = rb._rng
    BufferStream(rb, 8).seed_replica(Shard())
    assert rb._rng is generator  # one process: the buffer's own (checkpointed) generator stays
    draws = []
    for worker in range(2):
        copy = pickle.loads(pickle.dumps(BufferStream(rb, 8)))
        torch.manual_seed(0)  # both copies start from the same global RNG, as forked workers do
        copy.seed_replica(Shard(worker_id=worker, num_workers=2, worker_seed=5))
        draws.append(copy.sample()["x"])
    assert not torch.equal(draws[0], draws[1])


def test_wait_until_ready_times_out_with_a_message_that_says_what_to_do():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(RuntimeError, match="empty"):
        BufferStream(rb, 2).wait_until_ready()
    with pytest.raises(TimeoutError, match="min_size=3"):
        BufferStream(rb, 2, min_size=3, wait_timeout=0.05).wait_until_ready()


def test_an_emptied_buffer_is_explained():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    stream = BufferStream(rb, 2)
    stream.sample()
    rb.empty()
    with pytest.raises(RuntimeError, match="became empty after 1 batches"):
        stream.sample()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2, "min_size": -1}, "min_size"),
        ({"batch_size": 2, "wait_timeout": 0}, "wait_timeout"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BufferStream(ReplayBuffer(storage=LazyTensorStorage(4)), **kwargs)
