"""rb_lightning: a TorchRL ReplayBuffer as a first-class PyTorch Lightning data source.

The names below are imported on first use (``rb_lightning.ReplayBufferDataModule``
imports torch, tensordict, torchrl and lightning then), so ``import rb_lightning``
itself is instant and the console scripts answer ``--help`` at once. The Hugging
Face helpers (:func:`to_hf_dataset`, :func:`from_hf_dataset`) import ``datasets``
when called.

Examples:
    >>> import rb_lightning
    >>> rb_lightning.ReplayBufferDataModule.__module__
    'rb_lightning.lightning.datamodule'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rb_lightning.namespaces import lazy_names

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.buffers.mixture import SOURCE_KEY, BufferMixture
    from rb_lightning.errors import RBLightningError, UsageError
    from rb_lightning.hf.export import to_hf_dataset
    from rb_lightning.hf.load import from_hf_dataset
    from rb_lightning.lightning.datamodule import ReplayBufferDataModule
    from rb_lightning.runs.progress import StepProgressBar
    from rb_lightning.runs.report import RunReport
    from rb_lightning.runs.run_files import FinalLastCheckpoint, RunLogger
    from rb_lightning.sources.fill_members import FillMembers
    from rb_lightning.stream.datasets import (
        ReplayBufferBatchDataset,
        ReplayBufferDataset,
        ReplayBufferPassDataset,
    )
    from rb_lightning.stream.loader import batch_loader, keep_batch
    from rb_lightning.stream.rate_limiter import SamplesPerInsert
    from rb_lightning.stream.sampling import SAMPLER_INFO_KEYS, BufferStream

#: Public name -> the module that defines it.
_HOMES = {
    "BufferMixture": "rb_lightning.buffers.mixture",
    "BufferStream": "rb_lightning.stream.sampling",
    "FillMembers": "rb_lightning.sources.fill_members",
    "SOURCE_KEY": "rb_lightning.buffers.mixture",
    "FinalLastCheckpoint": "rb_lightning.runs.run_files",
    "SAMPLER_INFO_KEYS": "rb_lightning.stream.sampling",
    "ReplayBufferBatchDataset": "rb_lightning.stream.datasets",
    "ReplayBufferDataModule": "rb_lightning.lightning.datamodule",
    "ReplayBufferDataset": "rb_lightning.stream.datasets",
    "ReplayBufferPassDataset": "rb_lightning.stream.datasets",
    "RunLogger": "rb_lightning.runs.run_files",
    "RunReport": "rb_lightning.runs.report",
    "SamplesPerInsert": "rb_lightning.stream.rate_limiter",
    "StepProgressBar": "rb_lightning.runs.progress",
    "RBLightningError": "rb_lightning.errors",
    "UsageError": "rb_lightning.errors",
    "batch_loader": "rb_lightning.stream.loader",
    "from_hf_dataset": "rb_lightning.hf.load",
    "keep_batch": "rb_lightning.stream.loader",
    "to_hf_dataset": "rb_lightning.hf.export",
}

__all__ = [
    "BufferMixture",
    "BufferStream",
    "FillMembers",
    "FinalLastCheckpoint",
    "ReplayBufferBatchDataset",
    "ReplayBufferDataModule",
    "ReplayBufferDataset",
    "ReplayBufferPassDataset",
    "RunLogger",
    "RunReport",
    "SAMPLER_INFO_KEYS",
    "SOURCE_KEY",
    "RBLightningError",
    "SamplesPerInsert",
    "StepProgressBar",
    "UsageError",
    "batch_loader",
    "from_hf_dataset",
    "keep_batch",
    "to_hf_dataset",
]

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

# Plugins register what they add when imported: rb_lightning.distributed the Ray-served kind
# of buffer, rb_lightning.hf the export behind as_hf_dataset(). Both __init__ modules are
# light (no Ray, no `datasets` until used), and every rb_lightning module imports this one
# first, so the registrations are there before any buffer is resolved.
from rb_lightning import distributed as _distributed  # noqa: E402
from rb_lightning import hf as _hf  # noqa: E402

del _distributed, _hf
