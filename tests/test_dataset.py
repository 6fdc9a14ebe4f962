"""ReplayBufferDataset / ReplayBufferBatchDataset / ReplayBufferPassDataset on real buffers."""

from __future__ import annotations

import logging

import pytest
import torch
from rb_testdata import make_transitions
from tensordict import NonTensorStack, TensorDict, TensorDictBase
from torch.utils.data import DataLoader
from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.modules.llm.trl_interop import TorchRLBufferDataset

from rb_lightning import (
    ReplayBufferBatchDataset,
    ReplayBufferDataset,
    ReplayBufferPassDataset,
    batch_loader,
)


def _seeded_rb(storage_cls, seed: int = 0) -> ReplayBuffer:
    rb = ReplayBuffer(storage=storage_cls(500), generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)  # identical content for both buffers
    data = make_transitions(120)
    if storage_cls is ListStorage:
        for i in range(len(data)):
            rb.add(data[i])
    else:
        rb.extend(data)
    return rb


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, ListStorage])
@pytest.mark.parametrize("keys", [None, ["id", ("next", "reward"), "prompt"]])
def test_items_identical_to_seed_class(storage_cls, keys):
    """Same buffer, same generator seed: the seed class and ours yield the same items."""
    seed_items = list(TorchRLBufferDataset(_seeded_rb(storage_cls), 16, keys=keys, num_batches=3))
    ours = list(ReplayBufferDataset(_seeded_rb(storage_cls), 16, keys=keys, num_batches=3))
    assert len(ours) == len(seed_items) == 48
    for mine, theirs in zip(ours, seed_items, strict=True):
        assert list(mine) == list(theirs)
        assert all(_same(mine[k], theirs[k]) for k in theirs), (mine, theirs)
    assert "next.reward" in ours[0] and isinstance(ours[0]["prompt"], str)


def test_seed_docstring_example_runs_unchanged(list_rb):
    rb = ReplayBuffer(storage=ListStorage(100), batch_size=4)
    for _ in range(10):
        _ = rb.add(
            TensorDict(
                {
                    "input_ids": torch.randint(0, 100, (8,)),
                    "attention_mask": torch.ones(8, dtype=torch.long),
                },
                batch_size=[],
            )
        )
    dataset = ReplayBufferDataset(rb, batch_size=4)
    sample = next(iter(dataset))
    assert sample["input_ids"].shape == torch.Size([8])


def test_per_item_values_match_buffer_rows(tensor_rb):
    for item in ReplayBufferDataset(tensor_rb, 32, num_batches=2):
        i = int(item["id"])
        assert item["prompt"] == f"item {i}"
        assert item["next.reward"].item() == float(i)
        assert item["obs"].shape == (4,)


def test_missing_key_warned_once_and_skipped(tensor_rb, caplog):
    ds = ReplayBufferDataset(tensor_rb, 8, keys=["id", "nope"], num_batches=3)
    with caplog.at_level(logging.WARNING, logger="rb_lightning.stream.datasets"):
        items = list(ds)
    assert all(set(item) == {"id"} for item in items)
    assert sum("nope" in r.message for r in caplog.records) == 1


def test_device_moves_tensors(tensor_rb):
    item = next(iter(ReplayBufferDataset(tensor_rb, 4, device="cpu")))
    assert item["obs"].device == torch.device("cpu")
    batch = next(iter(ReplayBufferBatchDataset(tensor_rb, 4, device="meta")))
    assert batch["obs"].device.type == "meta"


def test_batch_mode_yields_whole_tensordicts(tensor_rb):
    batches = list(batch_loader(ReplayBufferBatchDataset(tensor_rb, 64, num_batches=3)))
    assert len(batches) == 3
    for batch in batches:
        assert isinstance(batch, TensorDictBase) and batch.batch_size == (64,)
        assert batch["next", "reward"].squeeze(-1).long().equal(batch["id"])
        assert batch["prompt"] == [f"item {i}" for i in batch["id"].tolist()]


def test_batch_mode_flatten_gives_flat_columns(tensor_rb):
    batch = next(iter(ReplayBufferBatchDataset(tensor_rb, 8, flatten=True)))
    assert set(batch) == {"id", "obs", "action", "next.reward", "next.done", "prompt"}
    assert batch["obs"].shape == (8, 4) and isinstance(batch["prompt"], list)


def test_batch_mode_keys_select(tensor_rb):
    batch = next(iter(ReplayBufferBatchDataset(tensor_rb, 8, keys=["obs", ("next", "done")])))
    assert set(batch.keys(True, True)) == {"obs", ("next", "done")}


def test_batch_mode_matches_raw_sample_stream():
    """No re-collation: each batch is exactly what rb.sample draws."""
    ours = list(ReplayBufferBatchDataset(_seeded_rb(LazyTensorStorage), 32, num_batches=4))
    rb = _seeded_rb(LazyTensorStorage)
    for batch in ours:
        assert batch["id"].equal(rb.sample(32)["id"])


def test_priority_info_reaches_plain_replay_buffer_batches():
    rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=PrioritizedSampler(100, 0.8, 0.5))
    rb.extend(make_transitions(100))
    batch = next(iter(ReplayBufferBatchDataset(rb, 16)))
    assert batch["index"].shape == (16,) and batch["priority_weight"].shape == (16,)
    assert batch["index"].equal(batch["id"])  # storage slot == id for this fill
    item = next(iter(ReplayBufferDataset(rb, 4)))
    assert {"index", "priority_weight"} <= set(item)
    # The info is usable: a huge priority on one slot makes it dominate the next draws.
    rb.update_priority(torch.arange(100), torch.full((100,), 1e-6))
    rb.update_priority(torch.tensor([7]), torch.tensor([1e6]))
    drawn = next(iter(ReplayBufferBatchDataset(rb, 64)))["id"]
    assert (drawn == 7).float().mean() > 0.9


def test_priority_info_kept_for_tensordict_replay_buffer():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(50), sampler=PrioritizedSampler(50, 0.7, 0.4)
    )
    rb.extend(make_transitions(50))
    batch = next(iter(ReplayBufferBatchDataset(rb, 8)))
    assert {"index", "priority_weight"} <= set(batch.keys())


def test_random_sampler_output_has_no_extra_keys(tensor_rb):
    """Seed-compatible output: no sampler info when the sampler has no weights."""
    item = next(iter(ReplayBufferDataset(tensor_rb, 4)))
    assert "index" not in item and "priority_weight" not in item


def test_nested_name_collision_raises():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(TensorDict({"a.b": torch.zeros(4), "a": {"b": torch.ones(4)}}, batch_size=[4]))
    with pytest.raises(ValueError, match=r"both flatten to the name 'a\.b'"):
        next(iter(ReplayBufferDataset(rb, 2)))
    with pytest.raises(ValueError, match="both flatten"):
        ReplayBufferDataset(rb, 2, keys=["a.b", ("a", "b")])
    # Selecting one of them is fine.
    assert next(iter(ReplayBufferDataset(rb, 2, keys=[("a", "b")])))["a.b"] == 1


def test_ragged_items_in_list_storage():
    rb = ReplayBuffer(storage=ListStorage(10))
    for n in (3, 5, 7):
        rb.add(TensorDict({"input_ids": torch.arange(n), "text": "x" * n}, batch_size=[]))
    items = list(ReplayBufferDataset(rb, 6))
    assert all(len(item["input_ids"]) == len(item["text"]) for item in items)


def test_plain_dict_buffer():
    rb = ReplayBuffer(storage=ListStorage(10))
    for i in range(5):
        rb.add({"x": torch.tensor(float(i)), "meta": {"y": torch.tensor(i)}})
    item = next(iter(ReplayBufferDataset(rb, 3)))
    assert set(item) == {"x", "meta.y"} and item["x"].item() == item["meta.y"].item()


def test_empty_buffer_raises_clear_error():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(RuntimeError, match="buffer is empty.*min_size"):
        next(iter(ReplayBufferDataset(rb, 2)))


def test_min_size_times_out_with_clear_error():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(make_transitions(2))
    ds = ReplayBufferBatchDataset(rb, 2, min_size=5, wait_timeout=0.05)
    with pytest.raises(TimeoutError, match="min_size=5.*holds 2"):
        next(iter(ds))


def test_min_size_waits_for_a_writer_thread():
    import threading

    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    writer = threading.Timer(0.2, lambda: rb.extend(make_transitions(50)))
    writer.start()
    batch = next(iter(ReplayBufferBatchDataset(rb, 8, min_size=50, wait_timeout=30)))
    writer.join()
    assert batch.batch_size == (8,)


def test_without_replacement_buffer_smaller_than_batch_raises():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(10),
        sampler=SamplerWithoutReplacement(drop_last=True),
        batch_size=8,
    )
    rb.extend(make_transitions(3))
    with pytest.raises(RuntimeError, match="batch_size=8"):
        next(iter(ReplayBufferBatchDataset(rb, 8)))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"replay_buffer": [1, 2]}, TypeError, "replay_buffer must be a torchrl ReplayBuffer"),
        ({"batch_size": 0}, ValueError, "batch_size must be a positive integer, got 0"),
        ({"batch_size": -1}, ValueError, "batch_size must be a positive integer"),
        ({"batch_size": 2.5}, ValueError, "batch_size must be a positive integer, got 2.5"),
        ({"batch_size": "8"}, ValueError, "batch_size must be a positive integer, got '8'"),
        ({"batch_size": True}, ValueError, "batch_size"),
        ({"num_batches": 0}, ValueError, "num_batches must be a positive integer or None"),
        ({"keys": "obs"}, TypeError, "keys must be a list"),
        ({"keys": [1]}, TypeError, "keys must hold strings"),
        ({"keys": []}, ValueError, "keys must not be empty"),
        ({"device": "nonsense"}, ValueError, "device='nonsense' is not a valid torch device"),
        ({"min_size": 0}, ValueError, "min_size must be a positive integer"),
        ({"wait_timeout": 0}, ValueError, "wait_timeout must be a positive number"),
    ],
)
@pytest.mark.parametrize("cls", [ReplayBufferDataset, ReplayBufferBatchDataset])
def test_bad_arguments_fail_at_construction(tensor_rb, cls, kwargs, error, match):
    args = {"replay_buffer": tensor_rb, "batch_size": 4, **kwargs}
    rb, bs = args.pop("replay_buffer"), args.pop("batch_size")
    with pytest.raises(error, match=match):
        cls(rb, bs, **args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_device_without_cuda_is_rejected(tensor_rb):
    with pytest.raises(ValueError, match="CUDA is not available.*device=None"):
        ReplayBufferDataset(tensor_rb, 4, device="cuda")


def test_len_and_repr(tensor_rb):
    assert len(ReplayBufferDataset(tensor_rb, 8, num_batches=3)) == 24
    assert len(ReplayBufferBatchDataset(tensor_rb, 8, num_batches=3)) == 3
    with pytest.raises(TypeError, match="unbounded"):
        len(ReplayBufferBatchDataset(tensor_rb, 8, num_batches=None))
    assert "batch_size=8" in repr(ReplayBufferDataset(tensor_rb, 8))


def test_unbounded_stream_keeps_going(tensor_rb):
    stream = iter(ReplayBufferBatchDataset(tensor_rb, 4, num_batches=None))
    assert len([next(stream) for _ in range(50)]) == 50


def test_pass_dataset_reads_every_item_once_in_order(tensor_rb):
    ids = torch.cat([b["id"] for b in ReplayBufferPassDataset(tensor_rb, 64)])
    assert ids.equal(torch.arange(200))
    assert len(ReplayBufferPassDataset(tensor_rb, 64)) == 4


def test_per_item_dataset_with_dataloader_collate(tensor_rb):
    loader = DataLoader(
        ReplayBufferDataset(tensor_rb, 16, keys=["obs", "id"], num_batches=2), batch_size=8
    )
    batches = list(loader)
    assert len(batches) == 4 and batches[0]["obs"].shape == (8, 4)


def test_strings_in_nontensorstack_columns():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(
        TensorDict({"x": torch.arange(3), "s": NonTensorStack("a", "b", "c")}, batch_size=[3])
    )
    for item in ReplayBufferDataset(rb, 6):
        assert item["s"] == "abc"[int(item["x"])]


def test_keys_all_missing_raises(tensor_rb):
    with pytest.raises(KeyError, match=r"None of keys=\['nope'\].*keys=None"):
        next(iter(ReplayBufferDataset(tensor_rb, 4, keys=["nope"])))


def test_a_batch_larger_than_the_buffer_is_said_once(caplog):
    # A sampler with replacement draws 64 items from 10 without complaint; the user hears it.
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(TensorDict({"x": torch.arange(10)}, batch_size=[10]))
    with caplog.at_level("WARNING", logger="rb_lightning.stream.sampling"):
        batches = list(batch_loader(ReplayBufferBatchDataset(rb, 64, num_batches=3)))
    assert [len(b) for b in batches] == [64, 64, 64]
    said = [r.getMessage() for r in caplog.records if "larger than the 10 items" in r.getMessage()]
    assert len(said) == 1 and "batch_size=64" in said[0] and "min_size=64" in said[0]
