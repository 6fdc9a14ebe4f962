"""Every byte of a buffer checkpoint is checked: a flipped byte deep in a large column stops the load.

A 200k-item buffer with 64-float observations (the size at which only metadata used to be
checksummed) is dumped beside a ``.ckpt``; one byte is flipped in the middle of a column, and
loading must name the file, the column and the fix, and leave the receiving buffer as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

from rb_lightning import BufferMixture, ReplayBufferDataModule
from rb_lightning.buffers.reader import load_buffer
from rb_lightning.buffers.state import (
    buffer_state,
    mixture_state,
    restore_buffer_state,
    restore_mixture_state,
)
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist.dumps import dump_buffer

ITEMS = 200_000
CAPACITY = 250_000  # not wrapped: the filled rows are written by rb_lightning


def _transitions(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    obs = torch.randn(n, 64, generator=torch.Generator().manual_seed(start))
    return TensorDict(
        {"id": ids, "obs": obs, "next": {"obs": obs + 1, "reward": ids.float().unsqueeze(-1)}},
        batch_size=[n],
    )


def _flip_middle_byte(path: Path) -> None:
    with open(path, "r+b") as file:
        file.seek(path.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A ``.ckpt`` with its buffer beside it, as ``BufferCheckpointIO`` writes it."""
    root = tmp_path_factory.mktemp("saved")
    rb = ReplayBuffer(
        storage=LazyMemmapStorage(CAPACITY, scratch_dir=root / "scratch"),
        generator=torch.Generator().manual_seed(0),
    )
    rb.extend(_transitions(ITEMS))
    checkpoint = {"datamodule": {"buffer": buffer_state(rb, inline_max_bytes=0)}}
    BufferCheckpointIO().save_checkpoint(checkpoint, root / "last.ckpt")
    return root


def _copy(saved: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the saved checkpoint and the path of its dump directory."""
    shutil.copytree(saved, tmp_path / "ckpt", ignore=shutil.ignore_patterns("scratch"))
    (version,) = (tmp_path / "ckpt" / "last.ckpt.buffer").iterdir()
    return tmp_path / "ckpt" / "last.ckpt", version


def _restore(ckpt: Path, target: ReplayBuffer, verify: str = "full") -> None:
    state = BufferCheckpointIO().load_checkpoint(ckpt, weights_only=True)["datamodule"]["buffer"]
    restore_buffer_state(target, state, ckpt, verify=verify)  # type: ignore[arg-type]


def _prefilled() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyMemmapStorage(CAPACITY))
    rb.extend(_transitions(10, start=10**6))
    return rb


def test_flipped_byte_in_a_large_column_names_file_column_and_fix(saved, tmp_path):
    ckpt, dump = _copy(saved, tmp_path)
    _flip_middle_byte(dump / "storage" / "next" / "obs.memmap")  # 51 MB: not a metadata file
    target = _prefilled()
    with pytest.raises(BufferCheckpointError) as caught:
        _restore(ckpt, target)
    message = str(caught.value)
    assert "storage/next/obs.memmap" in message
    assert "column 'next.obs'" in message
    assert "Resume from an earlier checkpoint" in message
    # Nothing half-loaded: the buffer still holds what it held.
    assert len(target) == 10 and target[:]["id"].min().item() == 10**6

    # A user who trusts the disk can skip the read; sizes are still checked.
    _restore(ckpt, target, verify="size")
    assert len(target) == ITEMS


def test_truncation_is_caught_in_every_mode_but_none(saved, tmp_path):
    ckpt, dump = _copy(saved, tmp_path)
    column = dump / "storage" / "obs.memmap"
    with open(column, "r+b") as file:
        file.truncate(column.stat().st_size - 4)
    for verify in ("full", "size"):
        with pytest.raises(BufferCheckpointError, match=r"storage/obs\.memmap \(column 'obs'"):
            _restore(ckpt, _prefilled(), verify=verify)


def test_checksums_are_of_the_bytes_on_disk_and_restore_exactly(saved, tmp_path):
    ckpt, _ = _copy(saved, tmp_path)
    target = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
    with pytest.raises(BufferCheckpointError, match="saved storage=LazyMemmapStorage"):
        _restore(ckpt, target)  # built differently: refused before anything else
    target = ReplayBuffer(storage=LazyMemmapStorage(CAPACITY))
    _restore(ckpt, target)
    assert torch.equal(target[:]["next", "obs"], _transitions(ITEMS)["next", "obs"])


def test_every_file_of_every_layout_of_dump_is_checksummed(tmp_path):
    small = ReplayBuffer(storage=LazyTensorStorage(8), generator=torch.Generator())
    small.extend(_transitions(12))  # wrapped: written whole by torchrl's checkpointer
    manifest = dump_buffer(small, tmp_path / "whole", pending_batches=[_transitions(2)])
    assert manifest["layout"] == "whole_storage"
    assert set(manifest["xxh3_64"]) == set(manifest["files"])
    assert any(name.startswith("pending_batches/") for name in manifest["files"])
    _flip_middle_byte(tmp_path / "whole" / "pending_batches" / "0" / "obs.memmap")
    with pytest.raises(BufferCheckpointError, match="column 'obs' of read-ahead batch 0"):
        load_buffer(ReplayBuffer(storage=LazyTensorStorage(8)), tmp_path / "whole")


def test_a_damaged_mixture_member_leaves_every_member_as_it_was(tmp_path):
    def mixture() -> BufferMixture:
        members = {name: ReplayBuffer(storage=LazyTensorStorage(64)) for name in ("a", "b")}
        return BufferMixture(members, fractions={"a": 0.5, "b": 0.5})

    source = mixture()
    source.members["a"].extend(_transitions(20))
    source.members["b"].extend(_transitions(30, start=100))
    checkpoint = {"datamodule": {"buffer": mixture_state(source, inline_max_bytes=0)}}
    BufferCheckpointIO().save_checkpoint(checkpoint, tmp_path / "last.ckpt")
    manifests = sorted((tmp_path / "last.ckpt.buffer").glob("*/manifest.json"))
    assert len(manifests) == 2  # both members beside the .ckpt
    for manifest in manifests:
        files = json.loads(manifest.read_text())["files"]
        if files.get("storage/id.memmap") == 30 * 8:  # member "b"
            _flip_middle_byte(manifest.parent / "storage" / "id.memmap")

    target = mixture()
    target.members["a"].extend(_transitions(5, start=10**6))
    loaded = BufferCheckpointIO().load_checkpoint(tmp_path / "last.ckpt", weights_only=True)
    with pytest.raises(BufferCheckpointError, match=r"storage/id\.memmap \(column 'id'"):
        restore_mixture_state(target, loaded["datamodule"]["buffer"], tmp_path / "last.ckpt")
    assert len(target.members["a"]) == 5 and len(target.members["b"]) == 0


def test_verify_is_a_datamodule_argument():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    assert ReplayBufferDataModule(rb, checkpoint_verify="size").checkpoint_verify == "size"
    with pytest.raises(ValueError, match=r"checkpoint_verify='fast'.*'full'.*'size'.*'none'"):
        ReplayBufferDataModule(rb, checkpoint_verify="fast")  # type: ignore[arg-type]


def test_could_not_load_names_the_real_cause(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(32))
    rb.extend(_transitions(8))
    dump_buffer(rb, tmp_path / "dump")

    # Built alike, but already filled with other columns: the column is the cause.
    other = ReplayBuffer(storage=LazyTensorStorage(32))
    other.extend(TensorDict({"id": torch.arange(4), "obs": torch.zeros(4, 3)}, batch_size=[4]))
    with pytest.raises(BufferCheckpointError) as caught:
        load_buffer(other, tmp_path / "dump")
    message = str(caught.value)
    assert "already held items" in message and "columns ['id', 'obs']" in message
    assert "Build the buffer as in the saved run" not in message

    # A scratch_dir that cannot be written: the directory is the cause.
    (tmp_path / "a-file").write_text("")
    disk = ReplayBuffer(storage=LazyMemmapStorage(32, scratch_dir=tmp_path / "a-file" / "rb"))
    dump_buffer(_memmap_copy(rb), tmp_path / "memmap-dump")
    with pytest.raises(BufferCheckpointError, match=r"into its scratch_dir .*a-file/rb"):
        load_buffer(disk, tmp_path / "memmap-dump")


def _memmap_copy(rb: ReplayBuffer) -> ReplayBuffer:
    copy = ReplayBuffer(storage=LazyMemmapStorage(32))
    copy.extend(rb[:])
    return copy
