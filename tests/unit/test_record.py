"""The saved-buffer record: one typed record per kind.

A checkpoint of the pre-release format (a dict tagged ``"location"``) is refused
with the error that says to re-create it, not read as a checkpoint without a buffer.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.buffers.reader import load_buffer
from rb_lightning.buffers.state import buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.record import BufferRecord, record_dumps


def test_a_checkpoint_of_the_pre_release_format_is_refused_with_what_to_do(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"x": torch.arange(5)}, batch_size=[5]))
    record = BufferRecord.from_dict(buffer_state(rb))
    legacy = {"location": "inline", "archive": record.archive, "len": 5, "write_count": 5}
    path = tmp_path / "last.ckpt"
    torch.save({"ReplayBufferDataModule": {"buffer": legacy}, "state_dict": {}}, path)
    with pytest.raises(BufferCheckpointError, match="pre-release rb_lightning format.*Re-create"):
        load_buffer(ReplayBuffer(storage=LazyTensorStorage(8)), path)


def test_a_beside_record_finds_its_directory_and_refuses_without_a_path():
    record = BufferRecord(kind="ranks", dir="last.ckpt.buffer", version="v1", world_size=2)
    assert record.directory("/runs/last.ckpt").as_posix() == "/runs/last.ckpt.buffer/v1"
    with record_dumps(record, "/runs/last.ckpt") as dumps:
        assert [p.as_posix() for p in dumps.values()] == [
            "/runs/last.ckpt.buffer/v1/rank0",
            "/runs/last.ckpt.buffer/v1/rank1",
        ]
    with pytest.raises(BufferCheckpointError, match="checkpoint path is unknown"):
        record.directory(None)
