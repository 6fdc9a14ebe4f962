"""From a replay buffer to training batches.

* :mod:`~rb_lightning.buffers.handles`: the buffer handle, chosen once per buffer
  (one process, one per DDP rank, a Ray actor, a mixture);
* :mod:`~rb_lightning.stream.sampling`: :class:`BufferStream`, the one object that
  draws batches;
* :mod:`~rb_lightning.stream.datasets`: the ``IterableDataset`` views of a stream;
* :mod:`~rb_lightning.stream.loader` and :mod:`~rb_lightning.stream.state`: the
  loader that hands batches to Lightning and the resumable stream position;
* :mod:`~rb_lightning.stream.sharding`, :mod:`~rb_lightning.buffers.priorities`,
  :mod:`~rb_lightning.stream.device_prefetch`: who samples, priority checks,
  host-to-device copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rb_lightning.namespaces import lazy_names

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.stream.datasets import (
        ReplayBufferBatchDataset,
        ReplayBufferDataset,
        ReplayBufferPassDataset,
    )
    from rb_lightning.stream.sampling import SAMPLER_INFO_KEYS, BufferStream

_HOMES = {
    "SAMPLER_INFO_KEYS": "rb_lightning.stream.sampling",
    "BufferStream": "rb_lightning.stream.sampling",
    "ReplayBufferBatchDataset": "rb_lightning.stream.datasets",
    "ReplayBufferDataset": "rb_lightning.stream.datasets",
    "ReplayBufferPassDataset": "rb_lightning.stream.datasets",
}
__all__ = [
    "SAMPLER_INFO_KEYS",
    "BufferStream",
    "ReplayBufferBatchDataset",
    "ReplayBufferDataset",
    "ReplayBufferPassDataset",
]
__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
