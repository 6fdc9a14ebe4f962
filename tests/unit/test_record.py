"""The saved-buffer record: one typed record per kind, read the same from every format.

A checkpoint written before the record (a dict tagged ``"location"``) must still
load: each of its kinds is read here as the record kind it is, and a real
``.ckpt`` of that format restores through ``load_buffer``.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.buffers.reader import load_buffer
from rb_lightning.buffers.state import buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.record import BufferRecord, find_record, record_dumps

LEGACY = [
    ({"location": "inline", "archive": torch.zeros(3, dtype=torch.uint8), "len": 2,
      "write_count": 5}, "inline", 1),
    ({"location": "beside", "dir": "last.ckpt.buffer", "version": "v", "len": 2,
      "write_count": 2}, "beside", 1),
    ({"location": "beside", "dir": "last.ckpt.buffer", "version": "v", "len": 4,
      "write_count": 4, "world_size": 3}, "ranks", 3),
    ({"location": "beside", "remote": True, "dir": "d", "version": "v", "len": 1,
      "write_count": 1}, "actor", 1),
    ({"location": "beside", "sharded": True, "dir": "d", "version": "v", "len": 1,
      "write_count": 1}, "shards", 1),
    ({"location": "remote", "saved_by_rank": 0}, "elsewhere", 1),
]  # fmt: skip


@pytest.mark.parametrize(("saved", "kind", "ranks"), LEGACY, ids=[k for _, k, _ in LEGACY])
def test_a_checkpoint_of_the_format_before_the_record_reads_as_its_kind(saved, kind, ranks):
    record = BufferRecord.from_dict(saved)
    assert (record.kind, record.saved_world_size) == (kind, ranks)
    # Written back in the record's format, it reads as the same record.
    assert BufferRecord.from_dict(record.to_dict()) == record


def test_a_legacy_mixture_keeps_its_members_in_source_id_order():
    member = {"location": "beside", "dir": "d", "version": "v", "len": 1, "write_count": 1}
    saved = {"location": "mixture", "names": ["online", "offline"],
             "members": {"offline": member, "online": member}, "generator": None}  # fmt: skip
    record = BufferRecord.from_dict(saved)
    assert record.is_mixture and record.names == ["online", "offline"]
    with record_dumps(record, "/runs/last.ckpt") as dumps:
        assert list(dumps) == ["online", "offline"]


def test_a_legacy_inline_checkpoint_file_loads_into_a_buffer(tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"x": torch.arange(5)}, batch_size=[5]))
    record = BufferRecord.from_dict(buffer_state(rb))
    legacy = {"location": "inline", "archive": record.archive, "len": 5, "write_count": 5}
    path = tmp_path / "last.ckpt"
    torch.save({"ReplayBufferDataModule": {"buffer": legacy}, "state_dict": {}}, path)
    assert find_record(torch.load(path, weights_only=True)).kind == "inline"
    restored = ReplayBuffer(storage=LazyTensorStorage(8))
    assert load_buffer(restored, path) == []
    assert restored[:]["x"].tolist() == [0, 1, 2, 3, 4] and restored.write_count == 5


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
