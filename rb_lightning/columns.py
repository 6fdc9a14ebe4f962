"""Turn a sampled batch into flat, named columns.

A sampled batch is a ``TensorDict`` (or a plain nested ``dict``). Consumers that
speak Hugging Face or plain PyTorch want flat ``"key0.key1"`` names, tensors
for numeric leaves and plain Python values for strings. This module does that
conversion once per batch, column by column, so that per-sample iteration is a
cheap ``zip`` instead of indexing a TensorDict ``batch_size`` times.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDictBase
from tensordict.utils import NestedKey

from rb_lightning import torchrl_compat
from rb_lightning.errors import ArgumentTypeError, UsageError

KEY_SEPARATOR = "."
#: Keys under which sampler info (storage index, importance weight) is attached to a
#: batch; the same names ``TensorDictReplayBuffer`` uses.
SAMPLER_INFO_KEYS = ("index", "priority_weight")


def flat_name(key: NestedKey) -> str:
    """Return the flat ``"key0.key1"`` name of a (possibly nested) key."""
    if isinstance(key, str):
        return key
    return KEY_SEPARATOR.join(str(part) for part in key)


def normalize_key(key: NestedKey) -> NestedKey:
    """Collapse one-element tuples to plain strings, as TensorDict does."""
    if isinstance(key, tuple) and len(key) == 1:
        return key[0]
    return key


def _is_leaf_class(cls: type) -> bool:
    # Non-tensor containers subclass TensorDictBase but hold values: treat as leaves.
    return not issubclass(cls, TensorDictBase) or issubclass(cls, (NonTensorData, NonTensorStack))


def leaf_keys(batch: Any) -> list[NestedKey]:
    """All leaf keys of a TensorDict or nested mapping, in insertion order."""
    if isinstance(batch, TensorDictBase):
        return [
            normalize_key(k)
            for k in batch.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf_class)
        ]
    if isinstance(batch, Mapping):
        keys: list[NestedKey] = []
        for name, value in batch.items():
            if isinstance(value, (Mapping, TensorDictBase)) and not isinstance(
                value, (NonTensorData, NonTensorStack)
            ):
                keys.extend((name, *_as_tuple(sub)) for sub in leaf_keys(value))
            else:
                keys.append(name)
        return keys
    raise ArgumentTypeError(
        "replay_buffer",
        f"Sampled batches must be TensorDicts or mappings, got {type(batch).__name__}. "
        "Store TensorDicts (or dicts of tensors) in the replay buffer.",
    )


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def check_unique_names(keys: Iterable[NestedKey]) -> None:
    """Raise if two different keys flatten to the same ``"a.b"`` name (one would overwrite the other)."""
    seen: dict[str, NestedKey] = {}
    for key in keys:
        name = flat_name(key)
        if name in seen and seen[name] != key:
            raise UsageError(
                "keys",
                f"Keys {seen[name]!r} and {key!r} both flatten to the name {name!r}; one would "
                "silently overwrite the other. Rename one of them in the buffer, or pass "
                "`keys=[...]` to select only one.",
            )
        seen[name] = key


def _get(batch: Any, key: NestedKey) -> Any:
    if isinstance(batch, TensorDictBase):
        return batch.get(key)
    value = batch
    for part in _as_tuple(key):
        value = value[part]
    return value


def column(batch: Any, key: NestedKey) -> torch.Tensor | list[Any]:
    """One leaf of a batch as a ``[B, ...]`` tensor or a list of ``B`` Python values."""
    try:
        value = _get(batch, key)
    except RuntimeError:
        # Ragged items in a lazy stack cannot be stacked into one tensor: keep them apart.
        if isinstance(batch, LazyStackedTensorDict):
            return [_plain(_get(item, key)) for item in batch.unbind(batch.stack_dim)]
        raise
    if isinstance(value, (NonTensorData, NonTensorStack)):
        return _non_tensor_list(value)
    return value


def _non_tensor_list(value: NonTensorData | NonTensorStack) -> list[Any]:
    if isinstance(value, NonTensorStack):
        items = value.tensordicts
        if all(type(item) is NonTensorData and not item.batch_size for item in items):
            # NonTensorStack.tolist() goes through tensorclass attribute access per item
            # (~9 us each, most of the cost of a string column): read the values directly.
            return [torchrl_compat.non_tensor_value(item) for item in items]
    values = value.tolist()
    if not isinstance(values, list):  # a scalar NonTensorData with empty batch size
        values = [values]
    return values


def _plain(value: Any) -> Any:
    if isinstance(value, NonTensorData):
        return value.data
    if isinstance(value, NonTensorStack):
        return value.tolist()
    return value


def columns(batch: Any, keys: Sequence[NestedKey]) -> dict[str, torch.Tensor | list[Any]]:
    """Flat ``{name: column}`` view of ``batch`` restricted to ``keys``."""
    return {flat_name(key): column(batch, key) for key in keys}


def batch_length(batch: Any) -> int:
    """Number of items in a sampled batch (its leading dimension)."""
    if isinstance(batch, TensorDictBase):
        return batch.batch_size[0]
    for key in leaf_keys(batch):
        return len(_get(batch, key))
    return 0


def rows(
    cols: Mapping[str, torch.Tensor | list[Any]], length: int, device: torch.device | None
) -> Iterable[dict[str, Any]]:
    """Yield ``length`` per-item dicts from flat columns (tensors ``unbind``-ed: views, one device move per column)."""
    names = list(cols)
    parts: list[Sequence[Any]] = []
    for name in names:
        col = cols[name]
        if isinstance(col, torch.Tensor):
            if device is not None:
                col = col.to(device)
            parts.append(col.unbind(0))
        else:
            if device is not None:
                col = [c.to(device) if isinstance(c, torch.Tensor) else c for c in col]
            parts.append(col)
    for values in zip(*parts, strict=True) if parts else ((),) * length:
        yield dict(zip(names, values, strict=True))


__all__ = [
    "SAMPLER_INFO_KEYS",
    "KEY_SEPARATOR",
    "batch_length",
    "check_unique_names",
    "column",
    "columns",
    "flat_name",
    "leaf_keys",
    "normalize_key",
    "rows",
]
