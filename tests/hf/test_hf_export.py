"""to_hf_dataset / from_hf_dataset on real buffers and real `datasets` objects."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from rb_testdata import make_transitions
from tensordict import NonTensorStack, TensorDict
from torch.utils.data import DataLoader
from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer, TensorDictReplayBuffer

from rb_lightning import ReplayBufferDataModule, ReplayBufferDataset
from rb_lightning.hf import from_hf_dataset, infer_features, to_hf_dataset

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.hf


@pytest.fixture
def tensor_rb() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
    rb.extend(make_transitions(200))
    return rb


def test_features_keep_dtypes_strings_and_nested_names(tensor_rb):
    features = infer_features(tensor_rb)
    assert features["id"] == datasets.Value("int64")
    assert features["obs"] == datasets.List(datasets.Value("float32"), length=4)
    assert features["next.reward"] == datasets.List(datasets.Value("float32"), length=1)
    assert features["next.done"] == datasets.List(datasets.Value("bool"), length=1)
    assert features["prompt"] == datasets.Value("string")
    stream = to_hf_dataset(tensor_rb, batch_size=8, num_batches=1)
    snapshot = to_hf_dataset(tensor_rb, streaming=False)
    for ds in (stream, snapshot):
        assert ds.features == features
        item = next(iter(ds))
        assert isinstance(item["prompt"], str) and item["prompt"] == f"item {item['id']}"
        assert item["next.reward"] == [float(item["id"])]
        assert isinstance(item["next.done"][0], bool)


def test_snapshot_is_storage_order_every_item_once():
    rb = ReplayBuffer(storage=LazyTensorStorage(50))
    rb.extend(make_transitions(70))  # wraps around: slots 0..19 hold ids 50..69
    snapshot = to_hf_dataset(rb, streaming=False, keys=["id", "prompt"])
    expected = list(range(50, 70)) + list(range(20, 50))
    assert snapshot["id"] == expected
    assert snapshot["prompt"] == [f"item {i}" for i in expected]
    assert snapshot.column_names == ["id", "prompt"]


def test_snapshot_of_ragged_list_storage_keeps_lengths():
    rb = ReplayBuffer(storage=ListStorage(10))
    for n in (3, 5, 2):
        rb.add(TensorDict({"input_ids": torch.arange(n), "text": f"len {n}"}, batch_size=[]))
    snapshot = to_hf_dataset(rb, streaming=False)
    assert snapshot.features["input_ids"] == datasets.List(datasets.Value("int64"))
    assert snapshot["input_ids"] == [[0, 1, 2], [0, 1, 2, 3, 4], [0, 1]]
    assert snapshot["text"] == ["len 3", "len 5", "len 2"]
    stream_rows = list(to_hf_dataset(rb, batch_size=2, num_batches=3))
    assert len(stream_rows) == 6
    assert all(len(r["input_ids"]) == int(r["text"].split()[1]) for r in stream_rows)


def test_stream_reads_live_buffer_and_is_bounded_by_num_batches():
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(make_transitions(10))
    stream = to_hf_dataset(rb, keys=["id"], batch_size=5, num_batches=4)
    assert len(list(stream)) == 20
    rb.extend(make_transitions(90, start=10))  # written after the export
    ids = {row["id"] for row in stream}
    assert max(ids) >= 10


def test_unbounded_stream_needs_a_consumer_limit(tensor_rb):
    stream = to_hf_dataset(tensor_rb, batch_size=4)  # bare buffer: unbounded by default
    assert "max_steps" in stream.info.description
    assert len(list(stream.take(50))) == 50


def test_user_features_override_inferred_ones(tensor_rb):
    features = {"action": datasets.Value("int32")}
    snapshot = to_hf_dataset(tensor_rb, streaming=False, keys=["id", "action"], features=features)
    assert snapshot.features["action"] == datasets.Value("int32")
    assert snapshot.features["id"] == datasets.Value("int64")
    with pytest.raises(ValueError, match="'nope'"):
        to_hf_dataset(tensor_rb, features={"nope": datasets.Value("int64")})


def test_stream_of_an_empty_buffer_takes_declared_features():
    rb = ReplayBuffer(storage=LazyTensorStorage(20))
    with pytest.raises(ValueError, match="features="):
        to_hf_dataset(rb)
    features = datasets.Features({"id": datasets.Value("int64")})
    dataset = ReplayBufferDataset(rb, 4, num_batches=2, min_size=4, wait_timeout=5)
    stream = to_hf_dataset(dataset, features=features)
    rb.extend(make_transitions(4))  # a collector writes after the export
    ids = [row["id"] for row in stream]
    assert len(ids) == 8 and set(ids) <= {0, 1, 2, 3}


def test_sources_give_their_sampling_arguments(tensor_rb):
    dataset = ReplayBufferDataset(tensor_rb, 6, keys=["id"], num_batches=3)
    assert dataset.as_hf_dataset().column_names == ["id"]
    assert len(list(dataset.as_hf_dataset())) == 18
    module = ReplayBufferDataModule(tensor_rb, batch_size=50, keys=["id", "prompt"])
    rows = list(to_hf_dataset(module))  # num_batches="auto": one buffer's worth
    assert len(rows) == 200 and set(rows[0]) == {"id", "prompt"}
    with pytest.raises(TypeError, match="ReplayBuffer"):
        to_hf_dataset([1, 2, 3])
    with pytest.raises(ValueError, match="num_batches"):
        to_hf_dataset(tensor_rb, num_batches=0)
    with pytest.raises(ValueError, match="n_shards=3 exceeds num_batches=2"):
        to_hf_dataset(tensor_rb, num_batches=2, n_shards=3, ranks="per_rank")


class _NoPickle:
    """Counts attempts to pickle (hash) the buffer it is attached to."""

    attempts = 0

    def __reduce__(self):
        type(self).attempts += 1
        raise RuntimeError("the buffer was pickled")


def test_export_never_hashes_or_pickles_the_buffer(tensor_rb):
    tensor_rb._no_pickle = _NoPickle()
    stream = to_hf_dataset(tensor_rb, batch_size=4, num_batches=2)
    snapshot = to_hf_dataset(tensor_rb, streaming=False)
    assert len(list(stream)) == 8 and len(snapshot) == 200
    assert snapshot.map(lambda row: {"n": row["id"] + 1})["n"][:2] == [1, 2]
    assert _NoPickle.attempts == 0


def test_dataloader_workers_split_batches_without_duplicates():
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(make_transitions(100))
    stream = to_hf_dataset(rb, keys=["id"], batch_size=5, num_batches=6, ranks="per_rank")
    assert stream.num_shards == 6
    loader = DataLoader(stream, batch_size=5, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert sum(len(b["id"]) for b in batches) == 30  # 6 batches in total, not 6 per worker
    per_worker = (
        [b["id"].tolist() for b in batches[0::2]],
        [b["id"].tolist() for b in batches[1::2]],
    )
    assert per_worker[0] != per_worker[1]  # each worker copy draws its own stream


def test_split_by_node_covers_a_pass_once():
    from datasets.distributed import split_dataset_by_node

    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(make_transitions(100))
    stream = to_hf_dataset(
        rb, keys=["id"], batch_size=5, num_batches=4, n_shards=4, ranks="per_rank"
    )
    counts = [len(list(split_dataset_by_node(stream, rank, 2))) for rank in (0, 1)]
    assert counts == [10, 10]
    snapshot = to_hf_dataset(rb, streaming=False, keys=["id"])
    parts = [list(split_dataset_by_node(snapshot, rank, 3)["id"]) for rank in range(3)]
    assert sorted(sum(parts, [])) == list(range(100))


def test_round_trip_keeps_values_and_dtypes():
    rb = ReplayBuffer(storage=LazyTensorStorage(64))
    items = make_transitions(40)
    items["mask"] = torch.randint(0, 2, (40, 3), dtype=torch.uint8)
    items["grid"] = torch.randn(40, 2, 3, dtype=torch.float64)
    rb.extend(items)
    snapshot = to_hf_dataset(rb, streaming=False)
    back = from_hf_dataset(snapshot)
    assert len(back) == 40
    restored = back[torch.arange(40)]
    for key in ("id", "obs", "action", ("next", "reward"), ("next", "done"), "mask", "grid"):
        original = items.get(key)
        assert restored.get(key).dtype == original.dtype, key
        torch.testing.assert_close(restored.get(key), original, rtol=0, atol=0)
    assert restored["prompt"] == items["prompt"]


def test_from_hf_dataset_fills_an_existing_buffer_and_rejects_ragged():
    ds = datasets.Dataset.from_dict(
        {"prompt": ["1+1=", "2+2="], "input_ids": [[1, 2], [3, 4]], "ragged": [[1], [1, 2]]}
    )
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    from_hf_dataset(ds, rb, columns=["prompt", "input_ids"])
    from_hf_dataset(ds, rb, columns=["prompt", "input_ids"])
    assert len(rb) == 4 and rb[3]["prompt"] == "2+2="
    # from_dict stores "input_ids" as int32 (a `datasets` optimization); the buffer keeps that.
    assert ds.features["input_ids"].feature.dtype == "int32"
    assert rb[torch.arange(2)]["input_ids"].dtype == torch.int32
    with pytest.raises(ValueError, match="'ragged'.*Pad"):
        from_hf_dataset(ds)
    with pytest.raises(TypeError, match="take"):
        from_hf_dataset(ds.to_iterable_dataset())


def test_missing_datasets_names_the_extra(monkeypatch, tensor_rb):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r'pip install "rb-lightning\[hf\]"'):
        to_hf_dataset(tensor_rb)


def test_importing_the_library_and_its_hf_helpers_does_not_import_hf_packages():
    # Not "transformers": lightning's torchmetrics imports it whenever it is installed.
    code = (
        "import sys, rb_lightning, rb_lightning.hf, rb_lightning.llm.data; "
        "from rb_lightning import from_hf_dataset, to_hf_dataset; "
        "import rb_lightning.checkpoint, rb_lightning.hf.trl_rollouts; "
        "print(sorted(m for m in ('datasets', 'trl', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_non_tensor_stack_prompt_arrives_as_str_in_stream():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"prompt": NonTensorStack("a", "b"), "x": torch.ones(2)}, [2]))
    rows = list(to_hf_dataset(rb, batch_size=2, num_batches=1))
    assert {r["prompt"] for r in rows} <= {"a", "b"} and all(
        isinstance(r["x"], float) for r in rows
    )


# -- ranks="identical": the stream every process agrees on -----------------------------------------
def ids_of(stream):
    return [row["id"] for row in stream]


def test_identical_streams_agree_across_exports_and_passes_differ(tensor_rb):
    first = to_hf_dataset(tensor_rb, keys=["id"], batch_size=8, num_batches=3, seed=11)
    second = to_hf_dataset(tensor_rb, keys=["id"], batch_size=8, num_batches=3, seed=11)
    assert first.num_shards == 1  # so Accelerate slices each global batch across processes
    pass0 = ids_of(first)
    tensor_rb.sample(32)  # other users of the buffer between batches change nothing
    assert ids_of(second) == pass0
    pass1 = ids_of(first)
    assert pass1 != pass0  # each pass of one export is a new draw, numbered the same everywhere
    assert ids_of(second) == pass1
    other_seed = to_hf_dataset(tensor_rb, keys=["id"], batch_size=8, num_batches=3, seed=12)
    assert ids_of(other_seed) != pass0


def test_identical_stream_slices_give_disjoint_positions(tensor_rb):
    from datasets.distributed import split_dataset_by_node

    full = ids_of(to_hf_dataset(tensor_rb, keys=["id"], batch_size=6, num_batches=2))
    parts = [
        ids_of(split_dataset_by_node(to_hf_dataset(tensor_rb, keys=["id"], batch_size=6,
                                                   num_batches=2), rank, 2))
        for rank in (0, 1)
    ]  # fmt: skip
    assert parts == [full[0::2], full[1::2]]  # every row read by exactly one process


def test_identical_stream_refusals_name_the_argument_and_the_fix(tensor_rb):
    from torchrl.data.replay_buffers import SamplerWithoutReplacement

    from rb_lightning import UsageError

    with pytest.raises(UsageError, match="n_shards=4 with ranks='identical'.*ranks='per_rank'"):
        to_hf_dataset(tensor_rb, num_batches=4, n_shards=4)
    with pytest.raises(UsageError, match="seed applies to ranks='identical'"):
        to_hf_dataset(tensor_rb, ranks="per_rank", seed=3)
    with pytest.raises(UsageError, match="ranks must be 'identical'"):
        to_hf_dataset(tensor_rb, ranks="same")
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SamplerWithoutReplacement())
    rb.extend(make_transitions(10))
    with pytest.raises(UsageError, match="SamplerWithoutReplacement.*streaming=False") as err:
        to_hf_dataset(rb)
    assert err.value.argument == "ranks"
    assert len(list(to_hf_dataset(rb, ranks="per_rank", num_batches=2, batch_size=2))) == 4


def test_bookkeeping_left_out_of_an_export_is_named(caplog):
    # A TensorDictReplayBuffer stores "index" with every item; the export leaves it out and
    # says so (the export command says it in its summary).
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    with caplog.at_level("WARNING", logger="rb_lightning.hf.arrow"):
        dataset = to_hf_dataset(rb, streaming=False)
    assert dataset.column_names == ["x"]
    assert any("leaves out index" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="rb_lightning.hf.arrow"):
        assert to_hf_dataset(rb, streaming=False, keys=["x", "index"]).column_names == ["x", "index"]
    assert not caplog.records
