"""A save killed before any of its filesystem steps leaves the old or the new checkpoint loadable.

The save of a ``.ckpt`` with its buffer beside it (``BufferCheckpointIO``, Lightning's own
``TorchCheckpointIO`` below it) creates directories, writes files, renames and deletes. A
forked child overwrites ``last.ckpt`` with a bigger buffer and SIGKILLs itself just before its
k-th such step (seen through Python's audit hooks: nothing in the save is replaced), for every
k; the parent then loads what is on disk. A killed process keeps what it wrote in the page
cache, so this tests process death; ``fsync`` before each rename covers a machine crash, which
no test here can cause.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from kill_points import run_killed_at
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.buffers.state import buffer_state, restore_buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CAPACITY = 64
OLD, NEW = 20, 28  # items in the previous and in the new checkpoint


def _buffer(n: int) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY), generator=torch.Generator())
    rb.extend(TensorDict({"id": torch.arange(n), "obs": torch.randn(n, 8)}, batch_size=[n]))
    return rb


def _save(rb: ReplayBuffer, path: Path) -> None:
    checkpoint = {"datamodule": {"buffer": buffer_state(rb, inline_max_bytes=0)}}
    BufferCheckpointIO().save_checkpoint(checkpoint, path)


def _save_in_child(root: Path, kill_at: int) -> int:
    """Fork; the child saves the new checkpoint, dying before change ``kill_at`` (0: never).

    Returns how many changes the child's save made (when it was not killed), else -9.
    """
    rb = _buffer(NEW)  # built here: what torchrl registers at build time is released here
    return run_killed_at(root, kill_at, lambda: _save(rb, root / "last.ckpt"))


def _loaded_items(path: Path) -> int:
    checkpoint = BufferCheckpointIO().load_checkpoint(path, weights_only=True)
    target = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
    restore_buffer_state(target, checkpoint["datamodule"]["buffer"], path)
    return len(target)


def test_a_save_killed_before_any_of_its_steps_leaves_old_or_new(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    _save(_buffer(OLD), reference / "last.ckpt")
    steps = _save_in_child(reference, kill_at=0)
    assert _loaded_items(reference / "last.ckpt") == NEW
    assert steps >= 8, "the save made fewer filesystem changes than a dump, a rename and a .ckpt"

    outcomes = []
    for kill_at in range(1, steps + 1):
        root = tmp_path / f"kill-{kill_at}"
        root.mkdir()
        _save(_buffer(OLD), root / "last.ckpt")
        assert _save_in_child(root, kill_at) == -9
        try:
            outcomes.append(_loaded_items(root / "last.ckpt"))
        except BufferCheckpointError as error:
            pytest.fail(f"killed before change {kill_at} of {steps}: {error}")
        # The next save clears what the dead one left and writes a checkpoint as usual.
        _save(_buffer(NEW), root / "last.ckpt")
        assert _loaded_items(root / "last.ckpt") == NEW
        assert len(list((root / "last.ckpt.buffer").iterdir())) == 1
        assert [entry.name for entry in root.iterdir() if entry.name.startswith(".")] == []
    # Early kills keep the previous checkpoint, late ones (after the rename) the new one.
    assert set(outcomes) == {OLD, NEW}
    assert outcomes == sorted(outcomes)
