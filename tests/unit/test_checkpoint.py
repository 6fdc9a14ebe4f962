"""rb_lightning.checkpoint as a unit: where a buffer's state goes and how it comes back."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.buffers.state import buffer_state, restore_buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist.beside import BufferDumpRequest, buffer_dir_for
from rb_lightning.persist.elastic import plan_redistribution
from rb_lightning.persist.record import BufferRecord


def _restore(rb, state, ckpt=None, *, rank: int, world_size: int, keep="all", seed=None):
    """Restore as a resumed rank does: the redistribution decided once, then the restore."""
    record = BufferRecord.of(state)
    plan = plan_redistribution(record, rank, world_size, keep=keep)
    if plan is not None and seed is not None:
        plan = dataclasses.replace(plan, seed=seed)
    return restore_buffer_state(rb, record, ckpt, rank=rank, redistribution=plan)


def _buffer(n: int = 6) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(16))
    if n:
        rb.extend(TensorDict({"id": torch.arange(n)}, batch_size=[n]))
    return rb


def test_small_buffer_is_packed_inline_and_restored():
    state = buffer_state(_buffer())
    record = BufferRecord.from_dict(state)
    assert record.kind == "inline" and record.len == 6
    restored = _buffer(0)
    assert restore_buffer_state(restored, state) == []
    assert restored[:6]["id"].tolist() == list(range(6))


def test_large_buffer_becomes_a_request_that_refuses_pickling():
    request = buffer_state(_buffer(), inline_max_bytes=0)
    assert isinstance(request, BufferDumpRequest)
    with pytest.raises(BufferCheckpointError, match="BufferCheckpointIO"):
        pickle.dumps(request)


def test_checkpoint_io_writes_beside_and_reads_back(tmp_path):
    io = BufferCheckpointIO()
    path = tmp_path / "step=1.ckpt"
    io.save_checkpoint(
        {"datamodule": {"buffer": buffer_state(_buffer(), inline_max_bytes=0)}}, path
    )
    versions = list(buffer_dir_for(path).iterdir())
    assert len(versions) == 1 and not versions[0].name.endswith(".tmp")
    loaded = io.load_checkpoint(path, weights_only=True)
    restored = _buffer(0)
    restore_buffer_state(restored, loaded["datamodule"]["buffer"], path)
    assert restored.write_count == 6
    io.remove_checkpoint(path)
    assert not path.exists() and not buffer_dir_for(path).exists()


def test_another_world_size_deals_the_items_out():
    state = buffer_state(_buffer())  # one process's buffer, resumed on 2
    shares = [_buffer(0), _buffer(0)]
    for rank, share in enumerate(shares):
        assert _restore(share, state, rank=rank, world_size=2) == []
    assert [share[: len(share)]["id"].tolist() for share in shares] == [[0, 2, 4], [1, 3, 5]]


def test_a_pre_release_record_or_unknown_kind_is_refused():
    with pytest.raises(BufferCheckpointError, match="pre-release rb_lightning format"):
        restore_buffer_state(_buffer(0), {"location": "inline"})
    with pytest.raises(BufferCheckpointError, match="kind 'cloud'.*reads inline, beside"):
        restore_buffer_state(_buffer(0), {"record": 1, "kind": "cloud"})
    with pytest.raises(BufferCheckpointError, match="record has version 2.*upgrade"):
        restore_buffer_state(_buffer(0), {"record": 2, "kind": "inline"})
