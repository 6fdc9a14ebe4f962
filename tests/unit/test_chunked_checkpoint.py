"""Chunked saves (BufferCheckpointIO(incremental=True)): what a save writes, what loads back, what is deleted."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from rb_lightning.buffers.reader import SavedBuffer, load_buffer, open_saved_buffer
from rb_lightning.buffers.state import buffer_state, restore_buffer_state
from rb_lightning.errors import BufferCheckpointError, NotEnoughDiskSpaceError, UsageError
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist import chunks
from rb_lightning.persist import files as persist_files
from rb_lightning.persist.chunks import collect_garbage, prepare_chunked_save
from rb_lightning.persist.dumps import load_dump
from rb_lightning.persist.elastic import plan_redistribution
from rb_lightning.persist.files import remove_stale_versions
from rb_lightning.persist.manifest import CHUNKS_DIR, MANIFEST
from rb_lightning.persist.record import BufferRecord

CAPACITY = 64


def _rows(n: int, start: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict({"id": ids, "obs": ids.float().unsqueeze(-1).expand(n, 3).clone()}, [n])


def _buffer(storage: type = LazyTensorStorage, **kwargs) -> ReplayBuffer:
    return ReplayBuffer(
        storage=storage(CAPACITY, **kwargs),
        sampler=PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.5),
        generator=torch.Generator().manual_seed(0),
    )


def _save(io: BufferCheckpointIO, rb: ReplayBuffer, path: Path) -> None:
    # A checkpoint dict as Lightning makes it: optimizer states mean a full (not weights-only) save.
    checkpoint = {"optimizer_states": [], "dm": {"buffer": buffer_state(rb, inline_max_bytes=0)}}
    io.save_checkpoint(checkpoint, path)


def _manifest(path: Path) -> dict:
    (version,) = Path(f"{path}.buffer").iterdir()
    return json.loads((version / MANIFEST).read_text())


def _restored(path: Path, storage: type = LazyTensorStorage, **kwargs) -> ReplayBuffer:
    rb = _buffer(storage)
    state = BufferCheckpointIO().load_checkpoint(path, weights_only=True)["dm"]["buffer"]
    restore_buffer_state(rb, state, path, **kwargs)
    return rb


def _assert_same(restored: ReplayBuffer, rb: ReplayBuffer) -> None:
    assert (
        restored[torch.arange(len(rb))]["id"].tolist() == rb[torch.arange(len(rb))]["id"].tolist()
    )
    assert restored.writer._write_count == rb.writer._write_count
    assert restored.writer._cursor == rb.writer._cursor
    for i in range(CAPACITY):
        assert restored.sampler._sum_tree[i] == rb.sampler._sum_tree[i]
        assert restored.sampler._min_tree[i] == rb.sampler._min_tree[i]
    assert torch.equal(restored._rng.get_state(), rb._rng.get_state())


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_each_save_writes_the_rows_written_since_the_last_and_loads_exactly(
    tmp_path, storage, background
):
    io = BufferCheckpointIO(incremental=True, background=background)
    rb = _buffer(storage)
    rb.extend(_rows(40, 0))
    written = [40]
    _save(io, rb, tmp_path / "s0.ckpt")
    for step in range(1, 6):  # 13 rows a save: the buffer wraps between saves 2 and 3
        rb.extend(_rows(13, 1000 * step))
        rb.update_priority(torch.arange(step, step + 4), torch.rand(4) + 0.5)
        written.append(13)
        _save(io, rb, tmp_path / f"s{step}.ckpt")
    io.teardown()
    assert [_manifest(tmp_path / f"s{step}.ckpt")["changed_rows"] for step in range(6)] == written
    assert rb.writer._write_count > CAPACITY  # wrapped
    _assert_same(_restored(tmp_path / "s5.ckpt", storage), rb)
    # An older checkpoint still loads its own buffer (its chunks are shared, not rewritten).
    assert len(_restored(tmp_path / "s1.ckpt", storage)) == 53


@pytest.fixture
def large_buffer_pieces(monkeypatch):
    """A test buffer's first save cut into the capacity / 64 pieces a large buffer's is."""
    monkeypatch.setattr(chunks, "_PIECE_MIN_BYTES", 0)


def test_rotation_deletes_the_chunks_no_kept_checkpoint_lists(tmp_path, large_buffer_pieces):
    io = BufferCheckpointIO(incremental=True)
    rb = _buffer()
    rb.extend(_rows(CAPACITY, 0))
    for step in range(12):
        rb.extend(_rows(16, 1000 * (step + 1)))
        _save(io, rb, tmp_path / f"s{step}.ckpt")
        if step >= 2:  # keep 2, as ModelCheckpoint(save_top_k=2) does
            io.remove_checkpoint(tmp_path / f"s{step - 2}.ckpt")
    io.teardown()
    listed = set(_manifest(tmp_path / "s10.ckpt")["chunks"]) | set(
        _manifest(tmp_path / "s11.ckpt")["chunks"]
    )
    assert set(os.listdir(tmp_path / CHUNKS_DIR)) == listed
    # 12 saves of a quarter of the buffer: two laps written, about one buffer kept.
    kept_rows = sum(
        json.loads(json.dumps(record))["files"]["id.memmap"] // 8
        for record in _manifest(tmp_path / "s11.ckpt")["chunks"].values()
    )
    assert kept_rows <= CAPACITY + 16
    _assert_same(_restored(tmp_path / "s11.ckpt"), rb)


def test_a_flipped_byte_in_a_chunk_is_refused_naming_it(tmp_path):
    io = BufferCheckpointIO(incremental=True, background=False)
    rb = _buffer()
    rb.extend(_rows(CAPACITY, 0))
    _save(io, rb, tmp_path / "last.ckpt")
    chunk = sorted((tmp_path / CHUNKS_DIR).iterdir())[0] / "obs.memmap"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(BufferCheckpointError, match=r"column 'obs' of the stored rows in chunk"):
        _restored(tmp_path / "last.ckpt")
    _restored(tmp_path / "last.ckpt", verify="size")  # same size: only a checksum sees it
    chunk.write_bytes(bytes(data[:-4]))
    with pytest.raises(BufferCheckpointError, match=r"should hold \d+ bytes and holds"):
        _restored(tmp_path / "last.ckpt", verify="size")


def test_a_buffer_not_written_through_its_writer_is_saved_whole(tmp_path):
    io = BufferCheckpointIO(incremental=True, background=False)
    rb = _buffer()
    rb.extend(_rows(30, 0))
    _save(io, rb, tmp_path / "a.ckpt")
    rb.empty()  # the writer starts over: the rows since the last save are not a ring range
    rb.extend(_rows(10, 500))
    _save(io, rb, tmp_path / "b.ckpt")
    assert _manifest(tmp_path / "b.ckpt")["changed_rows"] == 10 == len(rb)
    _assert_same(_restored(tmp_path / "b.ckpt"), rb)
    assert len(_restored(tmp_path / "a.ckpt")) == 30


def test_a_resumed_buffer_saves_only_what_it_wrote_after_the_resume(tmp_path):
    io = BufferCheckpointIO(incremental=True, background=False)
    rb = _buffer()
    rb.extend(_rows(CAPACITY, 0))
    _save(io, rb, tmp_path / "a.ckpt")
    resumed = _restored(tmp_path / "a.ckpt")
    resumed.extend(_rows(5, 900))
    _save(io, resumed, tmp_path / "b.ckpt")
    assert _manifest(tmp_path / "b.ckpt")["changed_rows"] == 5
    rb.extend(_rows(5, 900))
    _assert_same(_restored(tmp_path / "b.ckpt"), rb)
    # load_buffer reads a chunked checkpoint as any other.
    other = _buffer()
    load_buffer(other, tmp_path / "b.ckpt")
    _assert_same(other, rb)


def test_collection_keeps_what_live_buffers_build_on_and_stops_on_a_bad_manifest(tmp_path):
    rb = _buffer()
    rb.extend(_rows(CAPACITY, 0))
    version, _ = prepare_chunked_save(rb, tmp_path / "a.ckpt.buffer").finish()
    store = tmp_path / CHUNKS_DIR
    chunks = set(os.listdir(store))
    (store / "dead.tmp").mkdir()
    # No manifest lists the chunks, but rb's next save builds on them: kept.
    assert collect_garbage(store, []) == ["dead.tmp"]
    assert set(os.listdir(store)) == chunks
    bad = tmp_path / "b.ckpt.buffer" / "v"
    bad.mkdir(parents=True)
    (bad / MANIFEST).write_text("{not json")
    del rb
    gc.collect()  # a ReplayBuffer sits in reference cycles: gone only after a collection
    assert collect_garbage(store, [bad]) == []
    assert collect_garbage(store, [tmp_path / "a.ckpt.buffer" / version]) == []
    assert collect_garbage(store, []) == sorted(chunks)


def test_elastic_resume_and_open_saved_buffer_read_a_chunked_checkpoint(tmp_path):
    io = BufferCheckpointIO(incremental=True)
    rb = _buffer()
    rb.extend(_rows(CAPACITY, 0))
    _save(io, rb, tmp_path / "a.ckpt")
    rb.extend(_rows(24, 1000))  # wrapped: the buffer is chunks of both saves
    rb.update_priority(torch.arange(10), torch.arange(10).float() + 1)
    _save(io, rb, tmp_path / "last.ckpt")
    io.teardown()
    assert len(_manifest(tmp_path / "last.ckpt")["chunks"]) > 1
    saved = _ids(rb)

    state = BufferCheckpointIO().load_checkpoint(tmp_path / "last.ckpt")["dm"]["buffer"]
    shares = [_buffer() for _ in range(2)]
    record = BufferRecord.of(state)
    for rank, share in enumerate(shares):  # resumed on 2 ranks, as a DDP resume decides it
        plan = plan_redistribution(record, rank, 2, keep="all")
        restore_buffer_state(share, record, tmp_path / "last.ckpt", rank=rank, redistribution=plan)
    assert sorted(_ids(shares[0]) + _ids(shares[1])) == sorted(saved)
    # Priorities move with their items.
    saved_priority = {i: rb.sampler._sum_tree[row] for row, i in enumerate(saved)}
    for share in shares:
        for row, i in enumerate(_ids(share)):
            assert share.sampler._sum_tree[row] == pytest.approx(saved_priority[i])

    assert _ids(open_saved_buffer(tmp_path / "last.ckpt")) == saved
    assert "its buffer saved beside it" in SavedBuffer.read(tmp_path / "last.ckpt").kind


def _ids(rb: ReplayBuffer) -> list[int]:
    return rb[torch.arange(len(rb))]["id"].tolist()


class _FailsOnce(TorchCheckpointIO):
    """Lightning's CheckpointIO whose ``fail``-th ``.ckpt`` write raises (a remote store gone)."""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail, self.calls = fail, 0

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        self.calls += 1
        if self.calls == self.fail:
            raise OSError("the checkpoint store went away")
        super().save_checkpoint(checkpoint, path, storage_options=storage_options)


def test_a_background_save_that_fails_raises_at_the_next_call_and_keeps_the_last_checkpoint(
    tmp_path,
):
    io = BufferCheckpointIO(_FailsOnce(fail=2), incremental=True)
    rb = _buffer()
    rb.extend(_rows(40, 0))
    _save(io, rb, tmp_path / "last.ckpt")
    rb.extend(_rows(30, 100))  # wraps
    _save(io, rb, tmp_path / "last.ckpt")  # returns: the write fails in the writer thread
    with pytest.raises(OSError, match="went away"):
        io.teardown()
    assert len(_restored(tmp_path / "last.ckpt")) == 40  # the previous checkpoint, intact
    rb.extend(_rows(5, 200))
    _save(io, rb, tmp_path / "last.ckpt")  # builds on the failed save's published chunks
    io.teardown()
    assert _manifest(tmp_path / "last.ckpt")["changed_rows"] == 5
    _assert_same(_restored(tmp_path / "last.ckpt"), rb)


def test_incremental_and_background_take_bools_only():
    with pytest.raises(UsageError, match=r"incremental='yes'.*Pass a bool"):
        BufferCheckpointIO(incremental="yes")
    with pytest.raises(UsageError, match=r"background=1"):
        BufferCheckpointIO(incremental=True, background=1)


def test_a_save_under_way_keeps_its_staged_files_from_other_cleanups(tmp_path, monkeypatch):
    # Every row written to chunk files at once (as a large first save is), not copied.
    monkeypatch.setattr(chunks, "_COPY_MIN_BYTES", 0)
    rb = _buffer()
    rb.extend(_rows(CAPACITY, 0))
    directory = tmp_path / "last.ckpt.buffer"
    save = prepare_chunked_save(rb, directory)
    staged = {p.name for p in (tmp_path / CHUNKS_DIR).iterdir()} | {
        p.name for p in directory.iterdir()
    }
    assert staged and all(name.endswith(".tmp") for name in staged)
    # What another save's start (remove_stale_versions) or a rotation (collect_garbage) in
    # this process would remove of a dead save, this live one keeps.
    assert remove_stale_versions(directory) == []
    assert collect_garbage(tmp_path / CHUNKS_DIR, []) == []
    version, _ = save.finish()
    restored = _buffer()
    load_dump(restored, directory / version)
    _assert_same(restored, rb)


def test_a_save_that_would_not_fit_the_disk_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    io = BufferCheckpointIO(incremental=True, background=False)
    rb = _buffer()
    rb.extend(_rows(CAPACITY, 0))
    _save(io, rb, tmp_path / "a.ckpt")
    before = _files(tmp_path)
    rb.extend(_rows(10, 500))
    # The disk, emulated by the free-space probe: room for the rows, not for the sampler's
    # trees (16 bytes a slot) besides them.
    monkeypatch.setattr(persist_files, "free_disk_bytes", lambda path: 10 * 40 + 256 * 1024)
    with pytest.raises(NotEnoughDiskSpaceError, match="dirpath"):
        _save(io, rb, tmp_path / "b.ckpt")
    assert _files(tmp_path) == before  # no file written (an empty b.ckpt.buffer/ at most)
    monkeypatch.undo()
    _save(io, rb, tmp_path / "b.ckpt")  # the next save, with room, builds on a.ckpt's
    assert _manifest(tmp_path / "b.ckpt")["changed_rows"] == 10


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
