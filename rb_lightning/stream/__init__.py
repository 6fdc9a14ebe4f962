"""From a replay buffer to training batches: :class:`BufferStream` draws them
(:mod:`~rb_lightning.stream.sampling`), the datasets and the loader serve them, and
:mod:`~rb_lightning.stream.state` keeps the resumable position.
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
