"""A Hugging Face dataset into a replay buffer: :func:`from_hf_dataset`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.errors import ArgumentTypeError, MissingKeyError, UsageError
from rb_lightning.hf.arrow import CHUNK_SIZE, key_of, require_hf
from rb_lightning.validation import check_replay_buffer

if TYPE_CHECKING:  # pragma: no cover
    import datasets
    import pyarrow as pa

logger = logging.getLogger(__name__)


def _arrow_to_value(name: str, array: pa.Array) -> torch.Tensor | NonTensorStack:
    _, pa = require_hf()
    shape = [len(array)]
    values = array
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or (pa.types.is_fixed_size_list(values.type))
    ):
        if pa.types.is_fixed_size_list(values.type):
            size = values.type.list_size
        else:
            lengths = np.asarray(values.value_lengths().fill_null(0))
            if len(lengths) and (lengths != lengths[0]).any():
                raise UsageError(
                    "keys",
                    f"Column {name!r} holds lists of different lengths ({lengths.min()} to "
                    f"{lengths.max()}); a tensor storage needs one shape. Pad them first (e.g. "
                    "tokenizer(..., padding='max_length')) or leave the column out with keys=[...].",
                )
            size = int(lengths[0]) if len(lengths) else 0
        shape.append(size)
        values = values.flatten()
    if (
        pa.types.is_integer(values.type)
        or pa.types.is_floating(values.type)
        or (pa.types.is_boolean(values.type))
    ):
        # Arrow buffers are read-only: copy once so the tensor owns writable memory.
        flat = np.require(values.to_numpy(zero_copy_only=False), requirements=["C", "W"])
        return torch.from_numpy(flat).reshape(shape)
    return NonTensorStack(*array.to_pylist())


def from_hf_dataset(
    dataset: datasets.Dataset,
    replay_buffer: ReplayBuffer | None = None,
    *,
    columns: Sequence[str] | None = None,
) -> ReplayBuffer:
    """Write a ``datasets.Dataset`` into a replay buffer, column-wise, in row order.

    Numbers and fixed-length (or equal-length) lists become tensors of the
    matching dtype, strings become ``NonTensorStack`` items, and ``"a.b"``
    columns become nested keys ``("a", "b")``: the reverse of
    ``to_hf_dataset(..., streaming=False)``.

    Args:
        dataset: The ``datasets.Dataset`` to read (an ``IterableDataset`` must
            be materialized first, e.g. ``Dataset.from_list(list(ds.take(n)))``).
        replay_buffer: Buffer to extend; default: a new
            ``ReplayBuffer(storage=LazyTensorStorage(len(dataset)))``.

    Keyword Args:
        columns: Columns to read (default: all).

    Returns:
        The buffer that was written to.

    Examples:
        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2="], "meta.score": [0.5, 1.0]})
        >>> rb = from_hf_dataset(ds)
        >>> rb[1]["prompt"], rb[1]["meta", "score"].item()
        ('2+2=', 1.0)
    """
    datasets, _ = require_hf()
    if not isinstance(dataset, datasets.Dataset):
        raise ArgumentTypeError(
            "dataset",
            f"from_hf_dataset needs a datasets.Dataset, got {type(dataset).__name__}. "
            "Materialize a stream first: datasets.Dataset.from_list(list(stream.take(n))).",
        )
    names = list(dataset.column_names if columns is None else columns)
    unknown = [n for n in names if n not in dataset.column_names]
    if unknown:
        raise MissingKeyError(
            "columns", f"columns {unknown} are not in the dataset ({dataset.column_names})."
        )
    if replay_buffer is None:
        replay_buffer = ReplayBuffer(storage=LazyTensorStorage(max(1, len(dataset))))
    check_replay_buffer(replay_buffer)
    arrow = dataset.select_columns(names).with_format("arrow")
    for start in range(0, len(dataset), CHUNK_SIZE):
        table = arrow[start : start + CHUNK_SIZE]
        items = TensorDict(batch_size=[table.num_rows])
        for name in names:
            array = table.column(name).combine_chunks()
            items.set(key_of(name), _arrow_to_value(name, array))
        replay_buffer.extend(items)
    return replay_buffer


__all__ = ["from_hf_dataset"]
