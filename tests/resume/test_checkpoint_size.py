"""Checkpoints sized by content: a buffer that has not wrapped writes only its filled rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from resume_helpers import Recorder, buffer_ids, items, make_buffer, make_trainer
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.buffers.reader import load_buffer
from rb_lightning.buffers.state import buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist.dumps import dump_buffer
from rb_lightning.persist.manifest import read_manifest

CAPACITY = 10_000


def _rows(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"id": ids, "obs": (ids.float() / 1e4).unsqueeze(-1).expand(n, 32).clone()}, [n]
    )


def _dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _checkpoint_bytes(rb: ReplayBuffer, root: Path) -> int:
    io = BufferCheckpointIO()
    io.save_checkpoint({"DataModule": {"buffer": buffer_state(rb, inline_max_bytes=0)}}, root)
    return _dir_bytes(Path(f"{root}.buffer"))


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_thirty_percent_full_buffer_writes_thirty_percent_of_the_bytes(tmp_path, storage):
    part = ReplayBuffer(storage=storage(CAPACITY), generator=torch.Generator())
    part.extend(_rows(3_000))
    full = ReplayBuffer(storage=storage(CAPACITY), generator=torch.Generator())
    full.extend(_rows(CAPACITY))
    part_bytes = _checkpoint_bytes(part, tmp_path / "part.ckpt")
    full_bytes = _checkpoint_bytes(full, tmp_path / "full.ckpt")
    assert 0.25 * full_bytes < part_bytes <= 0.35 * full_bytes
    # Bare torchrl writes the capacity whatever the content.
    part.dumps(tmp_path / "bare")
    assert _dir_bytes(tmp_path / "bare") > 0.9 * full_bytes


@pytest.mark.parametrize("sampler", ["random", "prioritized", "without_replacement"])
def test_partly_full_buffer_round_trip_is_exact(tmp_path, sampler):
    rb = make_buffer(sampler, capacity=200)  # 40 of 200
    rb.sample(5)  # advance the generator and the without-replacement permutation
    if sampler == "prioritized":
        rb.update_priority(torch.arange(40), torch.arange(40).float() % 5 + 1)
    manifest = dump_buffer(rb, tmp_path / "dump")
    assert manifest["layout"] == "filled_rows" and manifest["capacity"] == 200
    restored = make_buffer(sampler, capacity=200, seed=7)
    restored.extend(items(150, 5_000))  # content that must go away
    load_buffer(restored, tmp_path / "dump")

    assert buffer_ids(restored) == buffer_ids(rb)
    assert [restored[i]["text"] for i in (0, 39)] == ["item 0", "item 39"]
    assert restored.storage.max_size == 200
    assert (restored.writer._cursor, restored.writer._write_count) == (40, 40)
    for _ in range(4):
        got, info = restored.sample(6, return_info=True)
        want, want_info = rb.sample(6, return_info=True)
        assert got["id"].tolist() == want["id"].tolist()
        if sampler == "prioritized":
            assert torch.equal(info["priority_weight"], want_info["priority_weight"])
    # Writing on continues at the same cursor in both.
    restored.extend(items(3, 900))
    rb.extend(items(3, 900))
    assert buffer_ids(restored) == buffer_ids(rb)


def test_wrapped_buffer_is_written_whole(tmp_path):
    rb = make_buffer(capacity=50)
    rb.extend(items(20, 100))  # 60 written into 50 slots
    assert dump_buffer(rb, tmp_path / "d")["layout"] == "whole_storage"


def test_restoring_into_another_capacity_is_refused(tmp_path):
    dump_buffer(make_buffer(capacity=200), tmp_path / "dump")
    with pytest.raises(BufferCheckpointError, match="max_size=200"):
        load_buffer(make_buffer(capacity=300, filled=False), tmp_path / "dump")


def test_trainer_resume_of_a_partly_full_prioritized_buffer_matches_straight_run(tmp_path):
    def run(root, steps, ckpt_path=None, filled=True):
        rb = make_buffer("prioritized", filled=filled, capacity=200)
        dm = ReplayBufferDataModule(rb, batch_size=8, num_batches=5, checkpoint_inline_max_bytes=0)
        model = Recorder(write_per_step=3, update_priority=True)
        make_trainer(root, steps, 4).fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return model

    straight = run(tmp_path / "straight", 8)
    first = run(tmp_path / "resumed", 4)
    ckpt = tmp_path / "resumed" / "ckpt" / "last.ckpt"
    layouts = {
        read_manifest(version)["layout"] for version in Path(f"{ckpt.resolve()}.buffer").iterdir()
    }
    assert layouts == {"filled_rows"}
    resumed = run(tmp_path / "resumed", 8, ckpt_path="last", filled=False)
    assert first.seen == straight.seen[:4]
    assert resumed.seen == straight.seen[4:]
