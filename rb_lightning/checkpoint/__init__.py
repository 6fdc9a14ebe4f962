"""Replay-buffer checkpoints, as a user calls them: save a buffer, read one back, verify it.

A :class:`~rb_lightning.ReplayBufferDataModule` saves its buffer with every Lightning
checkpoint by itself; these are the names for everything else:
:func:`dump_buffer` / :func:`load_dump` (a directory of memory-mapped tensors and JSON,
checked by :func:`read_manifest`), :func:`load_buffer` / :func:`open_saved_buffer` (any
saved buffer: a run, a ``.ckpt``, a dump) and :class:`BufferCheckpointAdapter` (a
component of a ``torchrl.checkpoint.Checkpoint``). A missing or damaged buffer raises
:class:`BufferCheckpointError`; a dump that would not fit the disk raises
:class:`NotEnoughDiskSpaceError` before anything is written. docs/layout.md has the layers.

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.checkpoint import dump_buffer, load_buffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = dump_buffer(rb, f"{tmp}/buf")
    ...     restored = ReplayBuffer(storage=LazyTensorStorage(10))
    ...     _ = load_buffer(restored, f"{tmp}/buf")
    >>> restored[:]["x"].tolist(), restored.write_count
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rb_lightning.errors import BufferCheckpointError, NotEnoughDiskSpaceError
from rb_lightning.namespaces import lazy_names

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.buffers.reader import SavedBuffer, load_buffer, open_saved_buffer
    from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
    from rb_lightning.persist.adapter import BufferCheckpointAdapter
    from rb_lightning.persist.dumps import dump_buffer, load_dump
    from rb_lightning.persist.manifest import read_manifest

_HOMES = {
    "BufferCheckpointAdapter": "rb_lightning.persist.adapter",
    "BufferCheckpointIO": "rb_lightning.lightning.checkpoint_io",
    "SavedBuffer": "rb_lightning.buffers.reader",
    "dump_buffer": "rb_lightning.persist.dumps",
    "load_buffer": "rb_lightning.buffers.reader",
    "load_dump": "rb_lightning.persist.dumps",
    "open_saved_buffer": "rb_lightning.buffers.reader",
    "read_manifest": "rb_lightning.persist.manifest",
}

__all__ = [
    "BufferCheckpointAdapter",
    "BufferCheckpointError",
    "BufferCheckpointIO",
    "NotEnoughDiskSpaceError",
    "SavedBuffer",
    "dump_buffer",
    "load_buffer",
    "load_dump",
    "open_saved_buffer",
    "read_manifest",
]
__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
