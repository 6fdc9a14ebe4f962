"""A replay buffer as a component of a ``torchrl.checkpoint.Checkpoint``, in rb_lightning's format.

See docs/checkpoints.md for why the format is not torchrl's ``dumps`` layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchrl.checkpoint import CheckpointAdapter

from rb_lightning.persist.dumps import dump_buffer, load_dump
from rb_lightning.persist.manifest import FORMAT_VERSION

__all__ = ["BufferCheckpointAdapter"]


class BufferCheckpointAdapter(CheckpointAdapter):
    """Store a replay buffer in a ``torchrl.checkpoint.Checkpoint`` with :func:`dump_buffer`.

    torchrl 0.14's default adapter writes a pickle and, in 0.14.1, restores string columns
    wrongly; this one is verified, pickle-free and keeps strings.

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.checkpoint import Checkpoint
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict({"s": ["a", "b"]}, batch_size=[2]))
        >>> path = f"{tempfile.mkdtemp()}/ckpt"
        >>> _ = Checkpoint(buffer=rb).register_adapter(ReplayBuffer, BufferCheckpointAdapter()).save(path)
        >>> restored = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> checkpoint = Checkpoint(buffer=restored).register_adapter(ReplayBuffer, BufferCheckpointAdapter())
        >>> checkpoint.load(path).loaded, list(restored[:2]["s"])
        ({'buffer'}, ['a', 'b'])
    """

    adapter_id = "rb_lightning.buffer"
    format_version = FORMAT_VERSION

    def save(
        self, component: Any, path: Path, *, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """Dump ``component`` (a ``ReplayBuffer``) into ``path``; ``kwargs`` go to :func:`dump_buffer`."""
        del args
        # torchrl's Checkpoint hands over a path that does not exist yet; dump_buffer creates it.
        return dump_buffer(component, path, **kwargs)["len"]

    def load(
        self,
        component: Any,
        path: Path,
        *,
        map_location: Any,
        tensor_load_kwargs: Mapping[str, Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Any:
        """Restore ``component`` from ``path``; returns the pending batches, if any were saved."""
        del map_location, tensor_load_kwargs, args, kwargs
        pending = load_dump(component, path)
        return pending or None
