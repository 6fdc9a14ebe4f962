"""torchrl 0.14.1's ``ReplayBuffer.dumps`` directory layout, read without a torchrl object.

The files and keys ``dumps`` writes are not a documented format: re-check them when the
pin moves (``tests/unit/test_torchrl_compat.py`` reads a fresh dump with each function).

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    >>> path = tempfile.mkdtemp()
    >>> rb.dumps(path)
    >>> is_dumps_directory(path), dumps_length(path)
    (True, 3)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

from rb_lightning.errors import PathNotFoundError

__all__ = [
    "DUMPS_MARKER",
    "dumps_length",
    "is_dumps_directory",
    "read_dumps_items",
    "saved_priority_tree",
]

#: The file ``ReplayBuffer.dumps`` (torchrl 0.14) always writes for a tensor storage, with the
#: number of filled rows under ``"len"``; without it a directory was not written by ``dumps``.
DUMPS_MARKER = Path("storage") / "storage_metadata.json"


def is_dumps_directory(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` looks like a directory written by ``ReplayBuffer.dumps(path)``."""
    return (Path(path) / DUMPS_MARKER).is_file()


def dumps_length(path: str | os.PathLike[str]) -> int:
    """Number of items in a ``ReplayBuffer.dumps`` directory (torchrl 0.14 layout).

    Raises:
        FileNotFoundError: When ``path`` has no ``storage/storage_metadata.json``.
    """
    marker = Path(path) / DUMPS_MARKER
    if not marker.is_file():
        raise PathNotFoundError(
            f"{path} is not a directory written by ReplayBuffer.dumps() with a tensor storage "
            f"(no {DUMPS_MARKER.as_posix()}). Point at the directory dumps wrote."
        )
    return int(json.loads(marker.read_text())["len"])


def read_dumps_items(path: str | os.PathLike[str]) -> TensorDictBase:
    """The filled rows of a ``ReplayBuffer.dumps`` directory, strings included, as a TensorDict.

    ``TensorDict.load_memmap`` keeps every string column, unlike ``ReplayBuffer.loads``
    in torchrl 0.14.1 (see :func:`~rb_lightning.torchrl_compat.workarounds.restore_non_tensor_columns`); no pickle is read.
    """
    size = dumps_length(path)
    return TensorDict.load_memmap(Path(path) / "storage", allow_pickle=False)[:size]


def saved_priority_tree(sampler_dir: str | os.PathLike[str]) -> tuple[torch.Tensor, float | None]:
    """A dumped ``PrioritizedSampler``'s tree values per storage slot, and its raw max priority.

    torchrl 0.14.1's ``PrioritizedSampler.dumps`` writes ``sumtree.memmap`` (float64,
    one ``(priority + eps) ** alpha`` per slot) and ``sampler_metadata.json``
    (``_max_capacity``, ``_max_priority`` as ``[value, index]``); read without a sampler.
    """
    root = Path(sampler_dir)
    metadata = json.loads((root / "sampler_metadata.json").read_text())
    capacity = int(metadata["_max_capacity"])
    tree = torch.from_file(str(root / "sumtree.memmap"), size=capacity, dtype=torch.float64)
    max_priority = (metadata.get("_max_priority") or [None])[0]
    return tree.clone(), None if max_priority is None else float(max_priority)
