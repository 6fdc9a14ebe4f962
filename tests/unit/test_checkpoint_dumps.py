"""Buffer dumps as a unit: round trip, manifest, atomic versions, build check, layouts refused."""

from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict
from torchrl.checkpoint import Checkpoint
from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
)

from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.adapter import BufferCheckpointAdapter
from rb_lightning.persist.dumps import dump_buffer, load_dump
from rb_lightning.persist.files import (
    pack_directory,
    remove_stale_versions,
    unpack_directory,
    write_version,
)
from rb_lightning.persist.manifest import MANIFEST, read_manifest


def _items(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"id": ids, "obs": ids.float().unsqueeze(-1), "text": [f"t{i}" for i in ids.tolist()]},
        batch_size=[n],
    )


def _buffer(capacity: int = 16, sampler=None) -> ReplayBuffer:
    return ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)


@pytest.mark.parametrize("n", [0, 5, 16, 21], ids=["empty", "filled-rows", "full", "wrapped"])
def test_round_trip_keeps_items_strings_and_write_count(tmp_path, n):
    rb = _buffer()
    if n:
        rb.extend(_items(n))
    manifest = dump_buffer(rb, tmp_path / "dump")
    restored = _buffer()
    assert load_dump(restored, tmp_path / "dump") == []
    assert len(restored) == len(rb) == manifest["len"]
    assert restored.write_count == n == manifest["write_count"]
    if n:
        size = len(rb)
        assert torch.equal(restored[:size]["id"], rb[:size]["id"])
        assert list(restored[:size]["text"]) == list(rb[:size]["text"])


def test_list_storage_round_trip(tmp_path):
    rb = ReplayBuffer(storage=ListStorage(8))
    for i in range(3):
        rb.add(TensorDict({"id": torch.tensor(i)}))
    dump_buffer(rb, tmp_path / "dump")
    restored = ReplayBuffer(storage=ListStorage(8))
    load_dump(restored, tmp_path / "dump")
    assert [int(restored[i]["id"]) for i in range(3)] == [0, 1, 2]


def test_pending_batches_come_back(tmp_path):
    rb = _buffer()
    rb.extend(_items(4))
    dump_buffer(rb, tmp_path / "dump", pending_batches=[_items(2, 100).exclude("text")])
    pending = load_dump(_buffer(), tmp_path / "dump")
    assert len(pending) == 1 and pending[0]["id"].tolist() == [100, 101]


def test_manifest_records_build_and_files(tmp_path):
    rb = _buffer(sampler=PrioritizedSampler(16, alpha=0.7, beta=0.5))
    rb.extend(_items(3))
    dump_buffer(rb, tmp_path / "dump")
    manifest = read_manifest(tmp_path / "dump")
    assert manifest["layout"] == "filled_rows"
    assert manifest["build"]["sampler"] == "PrioritizedSampler"
    assert manifest["build"]["sampler_settings"]["alpha"] == pytest.approx(0.7)
    assert all(
        (tmp_path / "dump" / name).stat().st_size == size
        for name, size in manifest["files"].items()
    )


def test_damaged_dump_is_refused_naming_the_file(tmp_path):
    rb = _buffer()
    rb.extend(_items(3))
    dump_buffer(rb, tmp_path / "dump")
    victim = next(p for p in (tmp_path / "dump").rglob("*.memmap"))
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(BufferCheckpointError, match=rf"corrupted: .*{victim.name}"):
        load_dump(_buffer(), tmp_path / "dump")


def test_missing_manifest_is_refused(tmp_path):
    rb = _buffer()
    rb.extend(_items(3))
    dump_buffer(rb, tmp_path / "dump")
    (tmp_path / "dump" / MANIFEST).unlink()
    with pytest.raises(BufferCheckpointError, match="no readable manifest.json"):
        load_dump(_buffer(), tmp_path / "dump")


def test_newer_format_is_refused(tmp_path):
    rb = _buffer()
    dump_buffer(rb, tmp_path / "dump")
    path = tmp_path / "dump" / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 99}))
    with pytest.raises(BufferCheckpointError, match="format 99"):
        read_manifest(tmp_path / "dump")


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"layout": "list_state_dict"}, "layout 'list_state_dict'"),
        ({"build": None}, "records no build"),
        ({"format": 0}, "format 0"),
    ],
    ids=["unknown-layout", "no-build-record", "format-0"],
)
def test_unreleased_older_layout_is_refused_with_the_fix(tmp_path, change, detail):
    rb = _buffer()
    rb.extend(_items(3))
    dump_buffer(rb, tmp_path / "dump")
    path = tmp_path / "dump" / MANIFEST
    manifest = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps({k: v for k, v in manifest.items() if v is not None}))
    restored = _buffer()
    restored.extend(_items(2, start=50))
    with pytest.raises(BufferCheckpointError) as caught:
        load_dump(restored, tmp_path / "dump")
    message = str(caught.value)
    assert detail in message and "earlier, unreleased layouts" in message
    assert "Resume from a checkpoint written by this version of rb_lightning" in message
    assert restored[:2]["id"].tolist() == [50, 51]  # untouched


def test_planted_pickle_is_refused(tmp_path):
    rb = _buffer()
    rb.extend(_items(3))
    dump_buffer(rb, tmp_path / "dump")
    (tmp_path / "dump" / "evil.pkl").write_bytes(b"not read")
    # The manifest does not list it either; the pickle check names it first.
    with pytest.raises(BufferCheckpointError):
        load_dump(_buffer(), tmp_path / "dump")


def test_mismatched_build_is_refused_naming_each_difference(tmp_path):
    rb = _buffer(sampler=PrioritizedSampler(16, alpha=0.7, beta=0.5))
    rb.extend(_items(3))
    dump_buffer(rb, tmp_path / "dump")
    other = _buffer(capacity=32, sampler=SamplerWithoutReplacement())
    with pytest.raises(
        BufferCheckpointError, match=r"max_size=16, given max_size=32.*sampler=PrioritizedSampler"
    ):
        load_dump(other, tmp_path / "dump")
    same_kind = _buffer(sampler=PrioritizedSampler(16, alpha=0.6, beta=0.5))
    with pytest.raises(
        BufferCheckpointError, match=r"alpha=0.7\), given PrioritizedSampler\(alpha=0.6"
    ):
        load_dump(same_kind, tmp_path / "dump")


def test_write_version_is_atomic_and_cleans_failures(tmp_path):
    rb = _buffer()
    rb.extend(_items(2))
    version, manifest = write_version(tmp_path, lambda path: dump_buffer(rb, path))
    assert [p.name for p in tmp_path.iterdir()] == [version]
    assert manifest["len"] == 2

    def dies(path):
        dump_buffer(rb, path)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_version(tmp_path, dies)
    assert [p.name for p in tmp_path.iterdir()] == [version]  # the failed .tmp is gone


def test_remove_stale_versions_removes_only_tmp(tmp_path):
    (tmp_path / "abc.tmp").mkdir()
    (tmp_path / "def").mkdir()
    assert [p.name for p in remove_stale_versions(tmp_path)] == ["abc.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["def"]


def test_pack_unpack_round_trip(tmp_path):
    rb = _buffer()
    rb.extend(_items(3))
    dump_buffer(rb, tmp_path / "dump")
    archive = pack_directory(tmp_path / "dump")
    assert archive.dtype == torch.uint8
    unpack_directory(archive, tmp_path / "copy")
    restored = _buffer()
    load_dump(restored, tmp_path / "copy")
    assert restored[:3]["id"].tolist() == [0, 1, 2]


def test_torchrl_checkpoint_adapter_archive_round_trip(tmp_path):
    rb = _buffer()
    rb.extend(_items(5))
    path = tmp_path / "ckpt.zip"
    Checkpoint(buffer=rb, format="archive").register_adapter(
        ReplayBuffer, BufferCheckpointAdapter()
    ).save(path)
    assert Checkpoint.manifest(path)["components"]["buffer"]["adapter"] == "rb_lightning.buffer"
    restored = _buffer()
    Checkpoint(buffer=restored).register_adapter(ReplayBuffer, BufferCheckpointAdapter()).load(path)
    assert list(restored[:5]["text"]) == [f"t{i}" for i in range(5)]
    assert restored.write_count == 5
