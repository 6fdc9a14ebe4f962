"""Send a buffer that owns a ``torch.Generator`` to spawned worker processes.

A ``ReplayBuffer(generator=...)`` pickles its generator state inside a
TensorDict; sent to a spawned ``DataLoader`` worker, that state's shared-memory
file fails to map in the child ("unable to resize file ... Invalid argument")
and the worker dies. Workers re-seed their copy anyway (see :mod:`rb_lightning.stream.sharding`), so
the buffer is pickled without its generator. The buffer itself is not changed.
"""

from __future__ import annotations

import threading
from multiprocessing.reduction import ForkingPickler

from torchrl.data import ReplayBuffer

from rb_lightning.torchrl_compat import buffer_generator, without_generator

_detach_lock = threading.Lock()


class _BufferPayload:
    """A buffer pickled ahead of time, to be restored by :func:`unpickle_buffer`."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def pickled_without_generator(rb: ReplayBuffer) -> ReplayBuffer | _BufferPayload:
    """``rb`` itself when it has no generator, else its pickle made without the generator."""
    if buffer_generator(rb) is None:
        return rb
    with _detach_lock, without_generator(rb):
        # ForkingPickler keeps shared-memory tensors shared, as the DataLoader would.
        return _BufferPayload(bytes(ForkingPickler.dumps(rb)))


def unpickle_buffer(value: ReplayBuffer | _BufferPayload) -> ReplayBuffer:
    """Inverse of :func:`pickled_without_generator`."""
    if isinstance(value, _BufferPayload):
        return ForkingPickler.loads(value.data)
    return value


__all__ = ["pickled_without_generator", "unpickle_buffer"]
