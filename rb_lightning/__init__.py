"""rb_lightning: a TorchRL ReplayBuffer as a first-class PyTorch Lightning data source.

The names below are imported on first use (``rb_lightning.ReplayBufferDataModule``
imports torch, tensordict, torchrl and lightning then), so ``import rb_lightning``
itself is instant and the console scripts answer ``--help`` at once. The Hugging
Face helpers (:func:`to_hf_dataset`, :func:`from_hf_dataset`) import ``datasets``
when called.

Examples:
    >>> import rb_lightning
    >>> rb_lightning.ReplayBufferDataModule.__module__
    'rb_lightning.datamodule'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.datamodule import ReplayBufferDataModule
    from rb_lightning.dataset import (
        ReplayBufferBatchDataset,
        ReplayBufferDataset,
        ReplayBufferPassDataset,
        batch_loader,
        keep_batch,
    )
    from rb_lightning.errors import UsageError
    from rb_lightning.hf import from_hf_dataset, to_hf_dataset
    from rb_lightning.mixture import SOURCE_KEY, BufferMixture, FillMembers
    from rb_lightning.progress import StepProgressBar
    from rb_lightning.report import RunReport
    from rb_lightning.runs import FinalLastCheckpoint, RunLogger
    from rb_lightning.stream import SAMPLER_INFO_KEYS, BufferStream

#: Public name -> the module that defines it.
_HOMES = {
    "BufferMixture": "rb_lightning.mixture",
    "BufferStream": "rb_lightning.stream",
    "FillMembers": "rb_lightning.mixture",
    "SOURCE_KEY": "rb_lightning.mixture",
    "FinalLastCheckpoint": "rb_lightning.runs",
    "SAMPLER_INFO_KEYS": "rb_lightning.stream",
    "ReplayBufferBatchDataset": "rb_lightning.dataset",
    "ReplayBufferDataModule": "rb_lightning.datamodule",
    "ReplayBufferDataset": "rb_lightning.dataset",
    "ReplayBufferPassDataset": "rb_lightning.dataset",
    "RunLogger": "rb_lightning.runs",
    "RunReport": "rb_lightning.report",
    "StepProgressBar": "rb_lightning.progress",
    "UsageError": "rb_lightning.errors",
    "batch_loader": "rb_lightning.dataset",
    "from_hf_dataset": "rb_lightning.hf",
    "keep_batch": "rb_lightning.dataset",
    "to_hf_dataset": "rb_lightning.hf",
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
    "StepProgressBar",
    "UsageError",
    "batch_loader",
    "from_hf_dataset",
    "keep_batch",
    "to_hf_dataset",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rb_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
