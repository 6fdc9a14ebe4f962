"""The handle of a buffer served by a Ray actor (torchrl's ``RayReplayBuffer``).

Registered for every buffer with a ``service_backend`` other than ``"direct"``
by :mod:`rb_lightning.distributed` (:func:`~rb_lightning.buffers.handles.register_buffer_kind`).

Examples:
    >>> import rb_lightning.distributed  # registers the kind (import rb_lightning does too)
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.buffers.handles import resolve_buffer
    >>> class ServedBuffer(ReplayBuffer):  # what a RayReplayBuffer says of itself
    ...     service_backend = "ray"
    >>> type(resolve_buffer(ServedBuffer(storage=LazyTensorStorage(4)))).__name__
    'RemoteBuffer'
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tensordict.utils import NestedKey
from torchrl.data import ReplayBuffer

from rb_lightning.buffers.handles import BufferHandle
from rb_lightning.distributed.ray_checkpoint import remote_buffer_state, restore_remote_buffer_state
from rb_lightning.errors import UsageError
from rb_lightning.persist.elastic import Redistribution
from rb_lightning.persist.manifest import Verify
from rb_lightning.persist.record import BufferRecord
from rb_lightning.stream.remote_prefetch import drained, remote_update_priority

__all__ = ["RemoteBuffer"]


class RemoteBuffer(BufferHandle):
    """A buffer served by a Ray actor that every process (rank, worker) shares."""

    samples_in_process: ClassVar[bool] = False
    update_priority = remote_update_priority  # sent without waiting (remote_prefetch)

    def describe(self) -> str:
        rb = self.replay_buffer
        return f"{type(rb).__name__}(len={len(rb)}, served by a {rb.service_backend} actor)"

    def in_process_buffers(self) -> list[ReplayBuffer]:
        return []

    def check_num_workers(self, num_workers: int) -> None:
        if num_workers > 0:
            raise UsageError(
                "num_workers",
                f"num_workers>0 with a {self.replay_buffer.service_backend}-backed replay "
                "buffer: it samples in its own actor, so worker processes add nothing but "
                "another connection. Use num_workers=0.",
            )

    def check_batch_size(self, batch_size: int) -> None:
        """The actor samples whatever size each call asks for."""

    def storage_device(self) -> torch.device | None:
        return None  # the storage lives in the actor

    def stored_keys(self) -> set[NestedKey] | None:
        return None  # reading an item would be a round trip; checked at the first sample

    def where(self) -> str:
        from rb_lightning.distributed.ray import where_it_runs

        return where_it_runs(self.replay_buffer)

    def prepare(self, num_workers: int) -> None:
        """The actor owns the sampler and its generator; its process drops its semaphore
        names (:func:`~rb_lightning.distributed.ray.release_semaphore_names`)."""
        from rb_lightning.distributed.ray import release_semaphore_names

        release_semaphore_names(self.replay_buffer)

    def reseed(self, seed: int) -> None:
        """Left alone: re-seeding the one shared sampler from each process would reset it."""

    def state_dict(self, trainer: Any, *, inline_max_bytes: int, pending_batches: list[Any]) -> Any:
        """The actor dumps itself beside the ``.ckpt``, on behalf of global rank 0 only.

        First every rank delivers the priority updates it holds and waits for them
        (:func:`~rb_lightning.stream.remote_prefetch.drained`), then the ranks meet: the
        dump holds every update made before the checkpoint, whichever rank made it.
        """
        drained(self.replay_buffer)
        if trainer is not None and trainer.world_size > 1:
            trainer.strategy.barrier("priority updates delivered before the buffer's dump")
        return remote_buffer_state(self.replay_buffer, trainer)

    def load_state_dict(
        self,
        record: BufferRecord,
        trainer: Any,
        *,
        verify: Verify,
        redistribution: Redistribution | None = None,
    ) -> list[Any]:
        """Rank 0 loads the actor; every rank waits for it before sampling (collective)."""
        path = trainer.ckpt_path if trainer is not None else None
        restore_remote_buffer_state(self.replay_buffer, record, path, trainer, verify=verify)
        return []
