"""The errors for a dump that the receiving buffer cannot take, each naming the cause and the fix.

Another storage type or capacity than the saved buffer's, columns that differ
from those the buffer already holds, a ``scratch_dir`` that cannot be written.

Examples:
    >>> from pathlib import Path
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> check_capacity(ReplayBuffer(storage=LazyTensorStorage(8)), Path("dump"), {"capacity": 16})
    Traceback (most recent call last):
    ...
    rb_lightning.errors.BufferCheckpointError: The buffer saved in dump has capacity max_size=16, the DataModule's buffer has max_size=8. Build the buffer with the same storage size as the saved run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.build import SAME_BUILD_HINT

__all__ = ["check_capacity", "require_storage", "unloadable"]


def require_storage(ok: bool, root: Path, what: str, replay_buffer: ReplayBuffer) -> None:
    if not ok:
        raise BufferCheckpointError(
            f"The buffer saved in {root} needs {what}, but the DataModule's buffer uses "
            f"{type(replay_buffer.storage).__name__}. Build the buffer as in the saved run."
        )


def check_capacity(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    saved = manifest.get("capacity")
    given = replay_buffer.storage.max_size
    if saved is not None and saved != given:
        raise BufferCheckpointError(
            f"The buffer saved in {root} has capacity max_size={saved}, the "
            f"DataModule's buffer has max_size={given}. Build the buffer with the "
            "same storage size as the saved run."
        )


def unloadable(
    root: Path, error: Exception, replay_buffer: ReplayBuffer, saved: Any = None
) -> BufferCheckpointError:
    """The error for saved items the receiving buffer could not take, naming the cause."""
    head = (
        f"Could not load the replay buffer saved in {root} into the DataModule's buffer "
        f"({type(error).__name__}: {error})."
    )
    storage = replay_buffer.storage
    scratch_dir = getattr(storage, "scratch_dir", None)
    if "already exists" in str(error):
        return BufferCheckpointError(
            f"{head} The storage refused to replace files already in its scratch_dir "
            f"{scratch_dir} (torchrl's existsok=False). Remove them, or give the storage "
            "another scratch_dir."
        )
    if isinstance(error, OSError):
        where = f"its scratch_dir {scratch_dir}" if scratch_dir else "its memory-mapped files"
        return BufferCheckpointError(
            f"{head} The storage could not write the restored items into {where}. Make that "
            "directory writable, with room for max_size items, or point the storage's "
            "scratch_dir at one that is."
        )
    difference = _column_difference(storage, saved)
    if difference is not None:
        return BufferCheckpointError(
            f"{head} The DataModule's buffer already held items when the checkpoint was "
            f"restored (filled by a source or a warm-up), and {difference}. Fill the buffer "
            "with the saved columns, or resume without filling it first."
        )
    return BufferCheckpointError(f"{head} {SAME_BUILD_HINT}")


def _column_difference(storage: Any, saved: Any) -> str | None:
    """How the saved items' columns differ from those of an already filled storage."""
    content = torchrl_compat.storage_content(storage)
    if not getattr(storage, "initialized", False) or not isinstance(saved, TensorDictBase):
        return None
    if not isinstance(content, TensorDictBase):
        return None

    def columns(data: TensorDictBase) -> dict[str, tuple[Any, ...]]:
        return {
            ".".join(key) if isinstance(key, tuple) else key: (tuple(leaf.shape[1:]), leaf.dtype)
            for key, leaf in data.items(include_nested=True, leaves_only=True)
            if isinstance(leaf, torch.Tensor)
        }

    held, wanted = columns(content), columns(saved)
    if held.keys() != wanted.keys():
        return f"it holds columns {sorted(held)}, the checkpoint {sorted(wanted)}"
    for name, (shape, dtype) in wanted.items():
        if held[name] != (shape, dtype):
            return (
                f"column {name!r} holds {held[name][1]} of shape {list(held[name][0])} per "
                f"item, the checkpoint's {dtype} of shape {list(shape)}"
            )
    return None
