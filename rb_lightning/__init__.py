"""rb_lightning: a TorchRL ReplayBuffer as a first-class PyTorch Lightning data source.

``import rb_lightning`` imports torch, tensordict, torchrl and lightning only;
the Hugging Face helpers (:func:`to_hf_dataset`, :func:`from_hf_dataset`)
import ``datasets`` when called.
"""

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

__all__ = [
    "BufferMixture",
    "BufferStream",
    "FillMembers",
    "SOURCE_KEY",
    "FinalLastCheckpoint",
    "SAMPLER_INFO_KEYS",
    "ReplayBufferBatchDataset",
    "ReplayBufferDataModule",
    "ReplayBufferDataset",
    "ReplayBufferPassDataset",
    "RunLogger",
    "RunReport",
    "StepProgressBar",
    "UsageError",
    "batch_loader",
    "from_hf_dataset",
    "keep_batch",
    "to_hf_dataset",
]

__version__ = "0.1.0"
