"""Buffer dumps on disk: exact round trips, the inline/beside policy, damage detection, rotation."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from resume_helpers import (
    CAPACITY,
    Recorder,
    buffer_ids,
    items,
    make_buffer,
    make_trainer,
)
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, ListStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.buffers.reader import load_buffer
from rb_lightning.buffers.state import buffer_state, restore_buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist.beside import BufferDumpRequest
from rb_lightning.persist.dumps import dump_buffer


def _sample_ids(rb: ReplayBuffer, times: int = 3) -> list[list[int]]:
    return [rb.sample(5)["id"].tolist() for _ in range(times)]


@pytest.mark.parametrize("sampler", ["random", "prioritized", "without_replacement"])
def test_round_trip_restores_content_cursor_sampler_and_stream(tmp_path, sampler):
    rb = make_buffer(sampler)
    rb.extend(items(70, 100))  # wraps around: the cursor is not at len
    rb.sample(5)  # advance generator and the without-replacement permutation
    if sampler == "prioritized":
        rb.update_priority(torch.arange(CAPACITY), torch.arange(CAPACITY).float() % 5 + 1)
    dump_buffer(rb, tmp_path / "dump")
    restored = make_buffer(sampler, filled=False, seed=123)
    load_buffer(restored, tmp_path / "dump")

    assert buffer_ids(restored) == buffer_ids(rb)
    # Strings too: torchrl's loads leaves them as they were in the target buffer.
    assert [restored[i]["text"] for i in (0, 7, 50)] == ["item 156", "item 163", "item 110"]
    written = 40 + 70
    assert restored.writer._cursor == rb.writer._cursor == written % CAPACITY
    assert restored.writer._write_count == rb.writer._write_count == written
    assert _sample_ids(restored) == _sample_ids(rb)


def test_list_storage_round_trip(tmp_path):
    rb = ReplayBuffer(storage=ListStorage(10), generator=torch.Generator().manual_seed(1))
    for i in range(6):
        rb.add(TensorDict({"id": torch.tensor(i), "tokens": torch.arange(i + 1)}, []))
    state = buffer_state(rb, inline_max_bytes=0)  # ListStorage cannot be dumped by torchrl
    assert state["kind"] == "inline"
    restored = ReplayBuffer(storage=ListStorage(10))
    restore_buffer_state(restored, state)
    assert [restored[i]["tokens"].tolist() for i in range(6)] == [
        list(range(i + 1)) for i in range(6)
    ]
    assert _sample_ids(restored) == _sample_ids(rb)


def test_empty_buffer_round_trip_keeps_generator(tmp_path):
    rb = make_buffer(filled=False, seed=5)
    state = buffer_state(rb)
    restored = make_buffer(seed=9)  # holds items that must go away
    restore_buffer_state(restored, state)
    assert len(restored) == 0
    rb.extend(items(10, 0))
    restored.extend(items(10, 0))
    assert _sample_ids(restored) == _sample_ids(rb)


def test_policy_small_inline_large_beside():
    rb = make_buffer()
    assert buffer_state(rb)["kind"] == "inline"
    assert isinstance(buffer_state(rb, inline_max_bytes=100), BufferDumpRequest)


def test_large_buffer_refuses_to_be_pickled_into_the_ckpt(tmp_path):
    request = buffer_state(make_buffer(), inline_max_bytes=0)
    with pytest.raises(BufferCheckpointError, match="BufferCheckpointIO"):
        torch.save({"buffer": request}, tmp_path / "x.ckpt")


def test_missing_and_corrupted_dumps_name_the_path(tmp_path):
    rb = make_buffer()
    dump_buffer(rb, tmp_path / "dump")
    target = make_buffer(filled=False)

    with pytest.raises(BufferCheckpointError, match=str(tmp_path / "nowhere")):
        load_buffer(target, tmp_path / "nowhere")

    broken = tmp_path / "truncated"
    shutil.copytree(tmp_path / "dump", broken)
    data = broken / "storage" / "id.memmap"
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(BufferCheckpointError, match=r"truncated.*id\.memmap"):
        load_buffer(target, broken)

    flipped = tmp_path / "flipped"
    shutil.copytree(tmp_path / "dump", flipped)
    meta = flipped / "writer" / "metadata.json"
    meta.write_text(meta.read_text().replace("40", "41"))
    with pytest.raises(BufferCheckpointError, match="checksum"):
        load_buffer(target, flipped)

    unfinished = tmp_path / "unfinished"
    shutil.copytree(tmp_path / "dump", unfinished)
    (unfinished / "manifest.json").unlink()
    with pytest.raises(BufferCheckpointError, match="unfinished"):
        load_buffer(target, unfinished)


def test_memmap_storage_beside(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(50, scratch_dir=tmp_path / "scratch"))
    rb.extend(items(30, 0).exclude("text"))  # LazyMemmapStorage itself does not keep strings
    io = BufferCheckpointIO()
    checkpoint = {"DataModule": {"buffer": buffer_state(rb, inline_max_bytes=0)}}
    io.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    assert checkpoint["DataModule"]["buffer"]["kind"] == "beside"
    loaded = io.load_checkpoint(tmp_path / "a.ckpt")
    restored = ReplayBuffer(storage=LazyMemmapStorage(50, scratch_dir=tmp_path / "scratch2"))
    restore_buffer_state(restored, loaded["DataModule"]["buffer"])
    assert buffer_ids(restored) == list(range(30))
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists() and not (tmp_path / "a.ckpt.buffer").exists()


def test_rotation_keeps_one_buffer_per_checkpoint_and_a_missing_one_is_an_error(tmp_path):
    rb = make_buffer()
    datamodule = ReplayBufferDataModule(
        rb, batch_size=8, num_batches=None, checkpoint_inline_max_bytes=0
    )
    trainer = make_trainer(tmp_path, max_steps=6, every=2)
    trainer.fit(Recorder(write_per_step=1), datamodule=datamodule)

    ckpt_dir = tmp_path / "ckpt"
    checkpoints = sorted(p.name for p in ckpt_dir.glob("*.ckpt"))
    assert checkpoints == ["epoch=0-step=6.ckpt", "last.ckpt"]  # save_top_k=1 rotated the others
    assert sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir()) == [
        name + ".buffer" for name in checkpoints
    ]
    for name in checkpoints:
        versions = list((ckpt_dir / f"{name}.buffer").iterdir())
        assert len(versions) == 1 and not versions[0].name.endswith(".tmp")
        manifest = json.loads((versions[0] / "manifest.json").read_text())
        assert manifest["len"] == 46 and manifest["write_count"] == 46
    # The .ckpt holds a reference, not the data.
    assert os.path.getsize(ckpt_dir / "last.ckpt") < 64 * 1024

    shutil.rmtree(ckpt_dir / "last.ckpt.buffer")
    fresh = ReplayBufferDataModule(make_buffer(), batch_size=8, num_batches=None)
    again = make_trainer(tmp_path, max_steps=8, every=2)
    with pytest.raises(BufferCheckpointError, match=r"last\.ckpt\.buffer"):
        again.fit(Recorder(), datamodule=fresh, ckpt_path="last")


def test_interrupted_save_leaves_previous_buffer_loadable(tmp_path):
    # A crash after the buffer dump but before the .ckpt is written: the old .ckpt
    # still points at its own complete version; the stray one is ignored, then pruned.
    io = BufferCheckpointIO()
    rb = make_buffer()
    io.save_checkpoint(
        {"dm": {"buffer": buffer_state(rb, inline_max_bytes=0)}}, tmp_path / "l.ckpt"
    )
    rb.extend(items(5, 500))
    BufferDumpRequest(rb).write(Path(f"{tmp_path}/l.ckpt.buffer"))  # new version, no new .ckpt
    (tmp_path / "l.ckpt.buffer" / "junk.tmp").mkdir()  # and a half-written one
    restored = make_buffer(filled=False)
    restore_buffer_state(restored, io.load_checkpoint(tmp_path / "l.ckpt")["dm"]["buffer"])
    assert buffer_ids(restored) == list(range(40))
    io.save_checkpoint(
        {"dm": {"buffer": buffer_state(rb, inline_max_bytes=0)}}, tmp_path / "l.ckpt"
    )
    assert len(list((tmp_path / "l.ckpt.buffer").iterdir())) == 1


def test_last_as_symlink_resumes_from_the_linked_checkpoints_buffer(tmp_path):
    datamodule = ReplayBufferDataModule(
        make_buffer(), batch_size=8, num_batches=None, checkpoint_inline_max_bytes=0
    )
    make_trainer(tmp_path, max_steps=4, every=2, save_last="link").fit(
        Recorder(write_per_step=1), datamodule=datamodule
    )
    last = tmp_path / "ckpt" / "last.ckpt"
    assert last.is_symlink() and not Path(f"{last}.buffer").exists()

    module = Recorder(write_per_step=1)
    resumed = ReplayBufferDataModule(make_buffer(filled=False), batch_size=8, num_batches=None)
    make_trainer(tmp_path, max_steps=5, every=2, save_last="link").fit(
        module, datamodule=resumed, ckpt_path="last"
    )
    assert module.start_step == 4
    assert module.start_ids == list(range(40)) + list(range(10_000, 10_004))


def test_buffer_built_differently_from_the_saved_one_is_a_clear_error(tmp_path):
    dump_buffer(make_buffer(), tmp_path / "dump")
    with pytest.raises(BufferCheckpointError, match=r"(?s)dump.*max_size"):
        load_buffer(make_buffer(capacity=CAPACITY // 2), tmp_path / "dump")
    with pytest.raises(BufferCheckpointError, match="ListStorage"):
        load_buffer(ReplayBuffer(storage=ListStorage(CAPACITY)), tmp_path / "dump")


def test_sampler_writer_and_settings_mismatch_is_a_clear_error(tmp_path):
    # A PrioritizedSampler checkpoint resumed into a RandomSampler buffer would drop the
    # priorities without a word; another writer or alpha would change the stream.
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler
    from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

    dump_buffer(make_buffer("prioritized"), tmp_path / "dump")
    manifest = json.loads((tmp_path / "dump" / "manifest.json").read_text())
    assert manifest["build"]["sampler"] == "PrioritizedSampler"
    assert manifest["build"]["sampler_settings"]["alpha"] == pytest.approx(0.8)

    with pytest.raises(
        BufferCheckpointError,
        match="saved sampler=PrioritizedSampler, given sampler=RandomSampler",
    ):
        load_buffer(make_buffer("random", filled=False), tmp_path / "dump")

    other_alpha = make_buffer("prioritized", filled=False)
    other_alpha._sampler = PrioritizedSampler(CAPACITY, alpha=0.6, beta=0.5)
    with pytest.raises(BufferCheckpointError, match=r"saved PrioritizedSampler\(alpha=0.8"):
        load_buffer(other_alpha, tmp_path / "dump")

    other_writer = make_buffer("prioritized", filled=False)
    other_writer._writer = TensorDictRoundRobinWriter()
    with pytest.raises(BufferCheckpointError, match="given writer=TensorDictRoundRobinWriter"):
        load_buffer(other_writer, tmp_path / "dump")


def test_trainer_resume_into_another_sampler_names_saved_and_given(tmp_path):
    datamodule = ReplayBufferDataModule(make_buffer("prioritized"), batch_size=8, num_batches=None)
    make_trainer(tmp_path, max_steps=2, every=2).fit(Recorder(), datamodule=datamodule)
    fresh = ReplayBufferDataModule(make_buffer("random"), batch_size=8, num_batches=None)
    with pytest.raises(BufferCheckpointError, match="sampler=PrioritizedSampler"):
        make_trainer(tmp_path, max_steps=4, every=2).fit(
            Recorder(), datamodule=fresh, ckpt_path="last"
        )
