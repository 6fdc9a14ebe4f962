"""A chunked save, and the rotation after it, killed before any filesystem step: old or new loads.

As ``test_checkpoint_kill_points.py`` for the chunked save (``BufferCheckpointIO(incremental=True)``,
its writer thread on): the parent saves ``old.ckpt`` (every row) and ``last.ckpt`` (the rows
since); a forked child writes more rows (the buffer wraps), saves ``last.ckpt`` again (only
those rows, in the writer thread), has ``old.ckpt`` rotated out (deleting the chunks only it
listed) and SIGKILLs itself just before its k-th filesystem change, for every k. The parent
then loads every checkpoint left, exactly, and checks that the next save clears what the
dead one left.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
import torch
from kill_points import run_killed_at
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from rb_lightning.buffers.state import buffer_state, restore_buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist.manifest import CHUNKS_DIR, MANIFEST

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CAPACITY = 64


def _rows(n: int, start: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict({"id": ids, "obs": ids.float().unsqueeze(-1).expand(n, 4).clone()}, [n])


def _buffer() -> ReplayBuffer:
    return ReplayBuffer(
        storage=LazyTensorStorage(CAPACITY),
        sampler=PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.5),
        generator=torch.Generator().manual_seed(0),
    )


def _save(io: BufferCheckpointIO, rb: ReplayBuffer, path: Path) -> None:
    checkpoint = {"optimizer_states": [], "dm": {"buffer": buffer_state(rb, inline_max_bytes=0)}}
    io.save_checkpoint(checkpoint, path)


def _ids(rb: ReplayBuffer) -> list[int]:
    return rb[torch.arange(len(rb))]["id"].tolist()


def _setup(root: Path) -> tuple[ReplayBuffer, dict]:
    """``old.ckpt`` (8 rows) and ``last.ckpt`` (48 rows) in ``root``; the buffer that saved them."""
    io = BufferCheckpointIO(incremental=True, background=False)  # no thread before the fork
    rb = _buffer()
    rb.extend(_rows(8, 0))
    _save(io, rb, root / "old.ckpt")
    saved: dict = {"old": _ids(rb), "old chunks": _listed_chunks(root)}
    rb.extend(_rows(40, 100))
    rb.update_priority(torch.arange(5), torch.full((5,), 3.0))
    _save(io, rb, root / "last.ckpt")
    saved["last"] = _ids(rb)
    return rb, saved


def _save_in_child(root: Path, rb: ReplayBuffer, kill_at: int) -> int:
    """Fork; the child saves and rotates, dying before change ``kill_at`` (0: never).

    Returns how many changes the child made (when it was not killed), else -9.
    """

    def save_and_rotate() -> None:
        io = BufferCheckpointIO(incremental=True)  # the writer thread starts here
        rb.extend(_rows(24, 200))  # wraps: rows 48-63 and 0-7, all of old.ckpt's rows
        rb.update_priority(torch.arange(30, 35), torch.full((5,), 2.0))
        _save(io, rb, root / "last.ckpt")
        io.remove_checkpoint(root / "old.ckpt")  # waits for the save, as rotation does
        io.teardown()

    return run_killed_at(root, kill_at, save_and_rotate)


def _loaded_ids(path: Path) -> list[int]:
    checkpoint = BufferCheckpointIO().load_checkpoint(path, weights_only=True)
    target = _buffer()
    restore_buffer_state(target, checkpoint["dm"]["buffer"], path)
    return _ids(target)


def _stored_chunks(root: Path) -> set[str]:
    return {p.name for p in (root / CHUNKS_DIR).iterdir()}


def _listed_chunks(root: Path) -> set[str]:
    """Chunks the buffers of the checkpoints in ``root`` list (a buffer without its .ckpt: none)."""
    listed: set[str] = set()
    for checkpoint in root.glob("*.ckpt"):
        for manifest in Path(f"{checkpoint}.buffer").glob(f"*/{MANIFEST}"):
            listed |= set(json.loads(manifest.read_text())["chunks"])
    return listed


def test_a_chunked_save_killed_before_any_of_its_steps_leaves_old_or_new(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    rb, saved = _setup(reference)
    steps = _save_in_child(reference, rb, kill_at=0)
    new = _loaded_ids(reference / "last.ckpt")
    assert not (reference / "old.ckpt").exists()
    assert new != saved["last"] and len(new) == CAPACITY
    del rb
    gc.collect()
    # The rotation deleted the chunk only old.ckpt listed (its rows 0-7 were rewritten).
    assert saved["old chunks"] and not saved["old chunks"] & _stored_chunks(reference)
    assert _stored_chunks(reference) == _listed_chunks(reference)
    assert steps >= 10, "fewer filesystem changes than chunks, a manifest, a rename and a .ckpt"

    outcomes = []
    for kill_at in range(1, steps + 1):
        root = tmp_path / f"kill-{kill_at}"
        root.mkdir()
        rb, saved = _setup(root)
        assert _save_in_child(root, rb, kill_at) == -9
        try:
            last = _loaded_ids(root / "last.ckpt")
            if (root / "old.ckpt").exists():
                assert _loaded_ids(root / "old.ckpt") == saved["old"]
        except BufferCheckpointError as error:
            pytest.fail(f"killed before change {kill_at} of {steps}: {error}")
        assert last in (saved["last"], new), f"killed before change {kill_at}: a torn buffer"
        outcomes.append(last == new)
        # The next save (a new process: no buffer of the dead one is alive) clears what the
        # dead save left: only the chunks kept checkpoints list remain, no staged version.
        del rb
        gc.collect()
        again = _buffer()
        again.extend(_rows(3, 500))
        io = BufferCheckpointIO(incremental=True, background=False)
        _save(io, again, root / "last.ckpt")
        assert _loaded_ids(root / "last.ckpt") == [500, 501, 502]
        assert _stored_chunks(root) == _listed_chunks(root), (
            f"killed before change {kill_at}: chunks left or lost"
        )
        assert len(list((root / "last.ckpt.buffer").iterdir())) == 1
        assert [entry.name for entry in root.iterdir() if entry.name.startswith(".")] == []
    # Early kills keep the previous checkpoint, late ones (after the .ckpt rename) the new one.
    assert set(outcomes) == {False, True}
    assert outcomes == sorted(outcomes)
