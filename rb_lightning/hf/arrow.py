"""Buffer items as Arrow: the ``datasets`` features of a buffer's columns, and its batches as tables.

Whole batches are converted column by column (no per-item Python); the features
are declared up front, so int64 token ids stay int64 and strings arrive as ``str``.
Imports ``datasets`` and ``pyarrow`` when called (the ``hf`` extra).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict.utils import NestedKey
from torchrl.data import ReplayBuffer, TensorStorage

from rb_lightning.buffers.handles import resolve_buffer
from rb_lightning.columns import (
    KEY_SEPARATOR,
    SAMPLER_INFO_KEYS,
    check_unique_names,
    column,
    leaf_keys,
    normalize_key,
)
from rb_lightning.columns import columns as batch_columns
from rb_lightning.errors import ArgumentTypeError
from rb_lightning.validation import check_replay_buffer

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

logger = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "rb-lightning[hf]"'
#: Storage slots read per slice when snapshotting or filling a buffer.
CHUNK_SIZE = 8_192
#: Items read from storage to infer the features of a stream.
PROBE_SIZE = 16
#: torchrl's bookkeeping, stored or sampled with the items (``TensorDictReplayBuffer``
#: writes ``index`` into every item): left out of an export unless ``keys`` names them.
BOOKKEEPING_KEYS: tuple[str, ...] = SAMPLER_INFO_KEYS

_TORCH_TO_HF = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "float32",  # Arrow has no bfloat16: widened, exactly.
}


def require_hf() -> tuple[Any, Any]:
    try:
        import datasets
        import pyarrow as pa
    except ImportError as err:
        raise ImportError(
            f"rb_lightning.hf needs the Hugging Face extra (datasets, pyarrow): {INSTALL_HINT}"
        ) from err
    return datasets, pa


# -- features ------------------------------------------------------------------------------------
def _tensor_feature(dtype: torch.dtype, dims: Sequence[int], fixed: bool) -> Any:
    datasets, _ = require_hf()
    if dtype not in _TORCH_TO_HF:
        raise ArgumentTypeError(
            "keys",
            f"Tensors of dtype {dtype} have no Arrow type; convert that key (e.g. to float32) "
            "or leave it out with keys=[...].",
        )
    feature: Any = datasets.Value(_TORCH_TO_HF[dtype])
    for size in reversed(dims):
        feature = datasets.List(feature, length=size if fixed else -1)
    return feature


def column_feature(name: str, col: torch.Tensor | list[Any], fixed: bool) -> Any:
    datasets, pa = require_hf()
    if isinstance(col, torch.Tensor):
        return _tensor_feature(col.dtype, col.shape[1:], fixed)
    sample = next((v for v in col if v is not None), None)
    if isinstance(sample, torch.Tensor):  # ragged items of a lazy stack
        return _tensor_feature(sample.dtype, sample.shape, fixed=False)
    if isinstance(sample, str):
        return datasets.Value("string")
    if isinstance(sample, bool):
        return datasets.Value("bool")
    if isinstance(sample, int):
        return datasets.Value("int64")
    if isinstance(sample, float):
        return datasets.Value("float64")
    try:
        arrow_type = pa.array(col).type
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ArgumentTypeError(
            "features",
            f"Column {name!r} holds {type(sample).__name__} values that Arrow cannot store "
            f"({err}). Leave it out with keys=[...] or pass features={{{name!r}: ...}}.",
        ) from None
    return datasets.features.features.generate_from_arrow_type(arrow_type)


def empty_buffer_error() -> ValueError:
    return ValueError(
        "The replay buffer is empty, so its features cannot be read from it. Fill it first, "
        "or pass features=datasets.Features({...}) (e.g. for a stream that waits for a "
        "collector with min_size)."
    )


def infer_features(replay_buffer: ReplayBuffer, keys: Sequence[NestedKey] | None = None) -> Any:
    """The ``datasets.Features`` an export of ``replay_buffer`` will have, read from the first stored items.

    Tensor storages give fixed-length lists (``List(..., length=L)``), list storages ragged
    ones, strings ``Value("string")``. Without ``keys``: every key but :data:`BOOKKEEPING_KEYS`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict({"x": torch.zeros(2, 3), "n": torch.ones(2)}, [2]))
        >>> infer_features(rb)
        {'x': List(Value('float32'), length=3), 'n': Value('float32')}
    """
    datasets, _ = require_hf()
    check_replay_buffer(replay_buffer)
    size = len(replay_buffer)
    if size == 0:
        raise empty_buffer_error()
    probe = read_items(replay_buffer, 0, min(size, PROBE_SIZE))
    if keys is None:
        stored = leaf_keys(probe)
        selected = [k for k in stored if k not in BOOKKEEPING_KEYS]
        left_out = [str(k) for k in stored if k in BOOKKEEPING_KEYS]
        if left_out:  # said once per export: a column that disappears without a word is a bug
            logger.warning(
                "to_hf_dataset leaves out %s (torchrl's bookkeeping, stored by the buffer); "
                "pass keys=[...] naming them to export them too.",
                ", ".join(left_out),
            )
    else:
        selected = list(keys)
    check_unique_names(selected)
    members = resolve_buffer(replay_buffer).in_process_buffers()
    fixed = all(isinstance(rb.storage, TensorStorage) for rb in members)
    cols = batch_columns(probe, selected)
    return datasets.Features({n: column_feature(n, c, fixed) for n, c in cols.items()})


def read_items(replay_buffer: ReplayBuffer, start: int, stop: int) -> Any:
    """Stored items ``start:stop``; a mixture's with their ``"source"`` column."""
    return resolve_buffer(replay_buffer).read(start, stop)


def key_of(name: str) -> NestedKey:
    parts = tuple(name.split(KEY_SEPARATOR))
    return normalize_key(parts)


# -- columns to Arrow ----------------------------------------------------------------------------
def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.contiguous().numpy()


def _nest(values: pa.Array, dims: Sequence[int]) -> pa.Array:
    _, pa = require_hf()
    for size in reversed(dims):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


def _arrow_column(name: str, col: torch.Tensor | list[Any], arrow_type: pa.DataType) -> pa.Array:
    _, pa = require_hf()
    try:
        if isinstance(col, torch.Tensor):
            array = to_numpy(col)
            values = _nest(pa.array(array.reshape(-1)), array.shape[1:])
        elif col and all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in col):
            # Ragged items: one flat value buffer plus offsets, no per-item Python lists.
            parts = [to_numpy(v) for v in col]
            lengths = np.array([len(p) for p in parts], dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            inner = np.concatenate([p.reshape(-1) for p in parts])
            values = pa.ListArray.from_arrays(
                pa.array(offsets), _nest(pa.array(inner), parts[0].shape[1:])
            )
        else:
            values = pa.array(col)
        return values if values.type == arrow_type else values.cast(arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        raise ArgumentTypeError(
            "features",
            f"Column {name!r} does not fit its feature (Arrow type {arrow_type}): {err}. Pass "
            f"features={{{name!r}: ...}} matching the buffer, or leave it out with keys=[...].",
        ) from None


def arrow_table(batch: Any, columns: Mapping[str, NestedKey], schema: pa.Schema) -> pa.Table:
    _, pa = require_hf()
    arrays = [
        _arrow_column(name, column(batch, key), schema.field(name).type)
        for name, key in columns.items()
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


__all__ = [
    "BOOKKEEPING_KEYS",
    "CHUNK_SIZE",
    "INSTALL_HINT",
    "arrow_table",
    "column_feature",
    "empty_buffer_error",
    "infer_features",
    "key_of",
    "read_items",
    "require_hf",
]
