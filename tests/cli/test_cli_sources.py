"""LoadDirectory and CallSource: fill a buffer, and fail early and clearly."""

from __future__ import annotations

import warnings

import pytest
import torch
import yaml
from cli_helpers import QUIET_TRAINER, run_cli, tensor_dict_buffer, toy_config, write_config
from cli_toy import fill_regression
from script_runs import run_train_py
from tensordict import NonTensorStack, TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.persist.dumps import dump_buffer
from rb_lightning.sources.buffer_sources import (
    CallSource,
    LoadDirectory,
    SourceError,
    resolve_callable,
)


def _saved(tmp_path, capacity=32, n=10, strings=False):
    # LazyMemmapStorage keeps only the first string of a column (torchrl 0.14.1): strings
    # are saved from a LazyTensorStorage.
    storage = LazyTensorStorage(capacity) if strings else LazyMemmapStorage(capacity)
    rb = TensorDictReplayBuffer(storage=storage)
    items = {"id": torch.arange(n), "obs": {"x": torch.randn(n, 3)}}
    if strings:
        items["text"] = NonTensorStack(*[f"t{i}" for i in range(n)])
    rb.extend(TensorDict(items, batch_size=[n]))
    path = tmp_path / "saved"
    rb.dumps(path)
    return rb, path


def test_load_directory_restores_items_in_order(tmp_path):
    saved, path = _saved(tmp_path)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32))
    LoadDirectory(path).fill(rb)
    assert len(rb) == 10
    assert torch.equal(rb[:10]["id"], torch.arange(10))
    assert torch.equal(rb[:10]["obs", "x"], saved[:10]["obs", "x"])


def test_load_directory_missing_or_foreign_directory_fails_at_construction(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such directory.*dumps"):
        LoadDirectory(tmp_path / "nope")
    (tmp_path / "other").mkdir()
    with pytest.raises(FileNotFoundError, match=r"storage_metadata.json.*not written by"):
        LoadDirectory(tmp_path / "other")


def test_load_directory_capacity_mismatch_names_both_sizes(tmp_path):
    _, path = _saved(tmp_path, capacity=32)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16))
    with pytest.raises(SourceError, match=r"capacity 32.*max_size=16.*max_size: 32"):
        LoadDirectory(path).fill(rb)


def test_load_directory_wraps_torchrl_errors(tmp_path):
    _, path = _saved(tmp_path)
    (path / "storage" / "meta.json").write_text("{truncated")  # a damaged save
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32))
    with pytest.raises(SourceError, match=r"could not load into TensorDictReplayBuffer"):
        LoadDirectory(path).fill(rb)


def test_load_directory_restores_string_columns(tmp_path):
    # torchrl 0.14.1's loads() alone gives every item the first item's string.
    saved, path = _saved(tmp_path, strings=True)
    assert LoadDirectory(path).non_tensor_keys() == ["text"]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # restored, so nothing to warn about
        LoadDirectory(path).fill(rb)
    assert list(rb[:10]["text"]) == [f"t{i}" for i in range(10)]
    assert torch.equal(rb[:10]["id"], saved[:10]["id"])


def fill_ids(replay_buffer, n: int = 3, start: int = 0):
    replay_buffer.extend(TensorDict({"id": torch.arange(start, start + n)}, batch_size=[n]))


def test_call_source_calls_function_with_buffer_and_kwargs():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    CallSource(f"{__name__}:fill_ids", kwargs={"n": 4, "start": 5}).fill(rb)
    assert rb[:4]["id"].tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("no_colon_here", ValueError, r"'package.module:function'"),
        ("not_a_module_xyz:fill", ImportError, r"cannot import module 'not_a_module_xyz'"),
        ("torchrl.data:NoSuchThing", ImportError, r"has no attribute 'NoSuchThing'"),
        ("torchrl:__version__", TypeError, r"not a callable"),
    ],
)
def test_call_source_bad_function_fails_at_construction(spec, error, match):
    with pytest.raises(error, match=match):
        CallSource(spec)
    with pytest.raises(error):
        resolve_callable(spec)


def test_datamodule_fills_the_buffers_each_stage_reads_once():
    def buffer():
        return ReplayBuffer(storage=LazyTensorStorage(20))

    def source(start):
        return CallSource(f"{__name__}:fill_ids", kwargs={"n": 2, "start": start})

    train, val, test = buffer(), buffer(), buffer()
    dm = ReplayBufferDataModule(
        train,
        batch_size=2,
        val_buffer=val,
        test_buffer=test,
        source=source(0),
        val_source=source(100),
        test_source=source(200),
    )
    dm.setup("validate")
    assert (len(train), len(val), len(test)) == (0, 2, 0)
    dm.setup("fit")
    dm.setup("validate")  # filled already: not again
    assert (len(train), len(val), len(test)) == (2, 2, 0)
    dm.setup("test")
    assert test[:2]["id"].tolist() == [200, 201] and len(val) == 2


def test_datamodule_rejects_source_without_its_buffer_or_of_wrong_type():
    rb = ReplayBuffer(storage=LazyTensorStorage(20))
    with pytest.raises(ValueError, match="val_source fills val_buffer, but no val_buffer"):
        ReplayBufferDataModule(rb, val_source=CallSource(f"{__name__}:fill_ids"))
    with pytest.raises(TypeError, match="source must be a rb_lightning.sources.BufferSource"):
        ReplayBufferDataModule(rb, source=fill_ids)


def test_datamodule_source_error_names_the_argument(tmp_path):
    _, path = _saved(tmp_path, capacity=32)
    dm = ReplayBufferDataModule(
        TensorDictReplayBuffer(storage=LazyTensorStorage(32)),
        val_buffer=TensorDictReplayBuffer(storage=LazyTensorStorage(8)),
        val_source=LoadDirectory(path),
    )
    with pytest.raises(SourceError) as info:
        dm.setup("fit")
    assert info.value.argument == "val_source"


def test_prefetching_buffer_must_share_the_batch_size():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), prefetch=2, batch_size=4)
    with pytest.raises(
        ValueError, match=r"prefetches batches of its own batch_size=4.*batch_size=8"
    ):
        ReplayBufferDataModule(rb, batch_size=8)
    ReplayBufferDataModule(rb, batch_size=4)


def test_load_directory_of_a_dump_buffer_folder_names_its_format_and_the_source_that_reads_it(
    tmp_path,
):
    """A dump_buffer folder (with a manifest) is not torchrl's dumps format: say so, and how to
    load it; a wrapped buffer's dump used to end in 'FileNotFoundError: ... buffer_metadata.json'
    blaming the receiving buffer's build."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
    fill_regression(rb, n=64)  # wraps: the dump holds a whole storage, as torchrl writes one
    dump_buffer(rb, tmp_path / "dumped")
    config = toy_config(tensor_dict_buffer(50), num_batches=2)
    load = {"class_path": "rb_lightning.sources.LoadDirectory", "init_args": {"path": "dumped"}}
    config["data"]["init_args"]["source"] = load
    quiet = [*QUIET_TRAINER, "--trainer.max_steps=2"]
    failed = run_train_py(
        ["fit", "--config", str(write_config(config, tmp_path)), *quiet], tmp_path
    )
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    line = failed.stderr.strip().splitlines()[-1]
    assert (
        "LoadDirectory(path='dumped'): the directory holds manifest.json, so it was written by"
        in line
    )
    assert "rb_lightning.checkpoint.dump_buffer, not by ReplayBuffer.dumps(path)" in line
    assert "buffer_metadata.json" not in line
    # The source the message gives, as it gives it, loads the folder.
    advised = line[line.index("{class_path") : line.index(" (in Python")]
    config["data"]["init_args"]["source"] = yaml.safe_load(
        advised.replace("'dumped'", repr(str(tmp_path / "dumped")))
    )
    cli = run_cli(
        ["fit", "--config", str(write_config(config, tmp_path)), "--trainer.max_steps=2"], tmp_path
    )
    assert cli.trainer.global_step == 2 and len(cli.datamodule.replay_buffer) == 50
