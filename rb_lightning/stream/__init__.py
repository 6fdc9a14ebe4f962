"""From a replay buffer to training batches.

* :mod:`~rb_lightning.stream.handles`: the buffer handle, chosen once per buffer
  (one process, one per DDP rank, a Ray actor, a mixture);
* :mod:`~rb_lightning.stream.sampling`: :class:`BufferStream`, the one object that
  draws batches;
* :mod:`~rb_lightning.stream.datasets`: the ``IterableDataset`` views of a stream;
* :mod:`~rb_lightning.stream.loader` and :mod:`~rb_lightning.stream.state`: the
  loader that hands batches to Lightning and the resumable stream position;
* :mod:`~rb_lightning.stream.sharding`, :mod:`~rb_lightning.stream.priorities`,
  :mod:`~rb_lightning.stream.device_prefetch`: who samples, priority checks,
  host-to-device copies.
"""

from __future__ import annotations

from rb_lightning.stream.datasets import (
    ReplayBufferBatchDataset,
    ReplayBufferDataset,
    ReplayBufferPassDataset,
)
from rb_lightning.stream.sampling import SAMPLER_INFO_KEYS, BufferStream

__all__ = [
    "SAMPLER_INFO_KEYS",
    "BufferStream",
    "ReplayBufferBatchDataset",
    "ReplayBufferDataset",
    "ReplayBufferPassDataset",
]
