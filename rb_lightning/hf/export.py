"""Hand a replay buffer to Hugging Face ``datasets`` (and so to TRL trainers).

:func:`to_hf_dataset` exports a live stream (``streaming=True``) or an Arrow snapshot
(``streaming=False``), converting whole batches column by column with the features declared
up front; nested keys become ``"a.b"`` columns. ``datasets`` and ``pyarrow`` are imported when
a function is called, never at ``import rb_lightning``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tensordict.utils import NestedKey
from torchrl.data import ReplayBuffer

from rb_lightning.columns import (
    check_unique_names,
    flat_name,
)
from rb_lightning.errors import ArgumentTypeError, UsageError
from rb_lightning.hf.arrow import (
    CHUNK_SIZE,
    arrow_table,
    empty_buffer_error,
    infer_features,
    key_of,
    read_items,
    require_hf,
)
from rb_lightning.hf.streaming import IDENTICAL, check_ranks, stream_dataset
from rb_lightning.stream.exporters import ExportDefaults
from rb_lightning.stream.sampling import BufferStream
from rb_lightning.validation import check_keys, check_positive_int

if TYPE_CHECKING:  # pragma: no cover
    import datasets

logger = logging.getLogger(__name__)

#: Items sampled per call in a stream built from a bare ``ReplayBuffer``.
DEFAULT_BATCH_SIZE = 256
_UNSET: Any = object()


# -- what to export ------------------------------------------------------------------------------
@dataclass
class _Plan:
    """What one export reads: the source's defaults with the caller's arguments applied."""

    source: ExportDefaults
    keys: list[NestedKey] | None
    num_batches: int | None

    @property
    def replay_buffer(self) -> ReplayBuffer:
        return self.source.replay_buffer

    def new_stream(self) -> BufferStream:
        """A stream of the export's own: it seeds and counts it; the source's stays as it is."""
        source = self.source
        return BufferStream(
            source.replay_buffer,
            source.batch_size,
            min_size=source.min_size,
            wait_timeout=source.wait_timeout,
        )


def _plan(source: ExportDefaults, batch_size: Any, keys: Any, num_batches: Any) -> _Plan:
    if batch_size is not None:
        source = replace(source, batch_size=check_positive_int(batch_size, "batch_size"))
    checked_keys = None if keys is None else check_keys(keys)
    if checked_keys is not None:
        check_unique_names(checked_keys)
    batches = None if num_batches is _UNSET else num_batches
    return _Plan(source, checked_keys, check_positive_int(batches, "num_batches", allow_none=True))


def _resolve_features(plan: _Plan, features: Any) -> tuple[Any, dict[str, NestedKey]]:
    """Features of the export and the buffer key behind each column."""
    datasets, _ = require_hf()
    if features is not None and not isinstance(features, Mapping):
        raise ArgumentTypeError(
            "features",
            f"features must be a datasets.Features or a dict {{column: feature}}, got "
            f"{type(features).__name__}.",
        )
    if len(plan.replay_buffer) == 0:
        if not features:
            raise empty_buffer_error()
        keys = plan.keys or [key_of(name) for name in features]
        resolved = datasets.Features(dict(features))
    else:
        resolved = infer_features(plan.replay_buffer, plan.keys)
        keys = plan.keys or [key_of(name) for name in resolved]
        unknown = set(features or {}) - set(resolved)
        if unknown:
            raise UsageError(
                "features",
                f"features names columns {sorted(unknown)} that the buffer does not have; "
                f"its columns are {list(resolved)}. Nested keys are named 'a.b'.",
            )
        resolved.update(dict(features or {}))
    by_name = {flat_name(k): k for k in keys}
    missing = [name for name in resolved if name not in by_name]
    if missing:
        raise UsageError(
            "features",
            f"features names columns {missing} that keys={plan.keys} leaves out; add them to keys.",
        )
    return resolved, {name: by_name[name] for name in resolved}


# -- snapshot ------------------------------------------------------------------------------------
def _snapshot(plan: _Plan, features: Any, columns: dict[str, NestedKey]) -> Any:
    datasets, pa = require_hf()
    from datasets.fingerprint import generate_random_fingerprint
    from datasets.table import InMemoryTable

    rb = plan.replay_buffer
    schema = features.arrow_schema
    size = len(rb)
    # Slices, not index tensors: indexing a NonTensorStack with a tensor clones every item.
    tables = [
        arrow_table(read_items(rb, start, min(start + CHUNK_SIZE, size)), columns, schema)
        for start in range(0, size, CHUNK_SIZE)
    ]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    info = datasets.DatasetInfo(
        description=f"Snapshot of {size} items of a torchrl replay buffer, in storage order.",
        features=features,
    )
    # A random fingerprint: hashing the content would cost as much as the export itself.
    return datasets.Dataset(
        InMemoryTable(table), info=info, fingerprint=generate_random_fingerprint()
    )


# -- public API ----------------------------------------------------------------------------------
class SupportsHFExport(Protocol):
    """What :func:`to_hf_dataset` accepts besides a buffer and a stream.

    :class:`~rb_lightning.ReplayBufferDataset`, :class:`~rb_lightning.ReplayBufferBatchDataset`,
    :class:`~rb_lightning.ReplayBufferPassDataset` and
    :class:`~rb_lightning.ReplayBufferDataModule` describe what they sample:
    ``hf_export_defaults()`` returns an :class:`~rb_lightning.stream.exporters.ExportDefaults`
    (buffer, batch size, keys, ``num_batches``, snapshot or stream), which
    :func:`to_hf_dataset`'s own arguments override. (Their ``as_hf_dataset(**options)``
    is ``to_hf_dataset(self, **options)``.)
    """

    def hf_export_defaults(self) -> ExportDefaults: ...


def _export_defaults(source: Any) -> ExportDefaults:
    """What ``source`` samples unless told otherwise."""
    if isinstance(source, ReplayBuffer):
        return ExportDefaults(source, DEFAULT_BATCH_SIZE)
    if isinstance(source, BufferStream):
        return ExportDefaults(
            source.replay_buffer,
            source.batch_size,
            min_size=source.min_size,
            wait_timeout=source.wait_timeout,
        )
    defaults = getattr(source, "hf_export_defaults", None)
    if not callable(defaults):
        raise ArgumentTypeError(
            "source",
            "to_hf_dataset(source) takes a torchrl ReplayBuffer, a BufferStream, a saved run or "
            "dump (a path), or a dataset or DataModule of rb_lightning (ReplayBufferDataset, "
            f"ReplayBufferBatchDataset, ReplayBufferPassDataset, ReplayBufferDataModule), got "
            f"{type(source).__name__}.",
        )
    return defaults()


def to_hf_dataset(
    source: ReplayBuffer | BufferStream | SupportsHFExport | str | os.PathLike[str],
    *,
    streaming: bool | None = None,
    keys: list[NestedKey] | None = None,
    num_batches: int | None = _UNSET,
    batch_size: int | None = None,
    features: Mapping[str, Any] | None = None,
    n_shards: int | None = None,
    ranks: Literal["identical", "per_rank"] = IDENTICAL,
    seed: int | None = None,
) -> datasets.IterableDataset | datasets.Dataset:
    """A replay buffer as a Hugging Face dataset, for ``trl`` / ``transformers`` trainers.

    Args:
        source: A torchrl ``ReplayBuffer``, a :class:`~rb_lightning.stream.BufferStream`,
            a dataset of :mod:`rb_lightning.stream.datasets` or a
            :class:`~rb_lightning.ReplayBufferDataModule` (their buffer, ``batch_size``,
            ``keys``, ``num_batches``, ``min_size`` and snapshot-or-stream are the defaults
            below); or the path of a saved run, ``.ckpt`` or dump (all members or ranks, with
            a ``"source"`` column).

    Keyword Args:
        streaming: ``True``: a ``datasets.IterableDataset`` sampling the live buffer.
            ``False``: a ``datasets.Dataset`` snapshot, storage order, each item once.
            Default: the source's, else ``True``.
        keys: Buffer keys to export (nested keys as tuples); default: all but torchrl's
            bookkeeping (``index``, ``priority_weight``).
        num_batches: Streaming only: sampling calls per pass (``None``: unbounded; the
            trainer stops it with ``max_steps``). Default: the source's.
        batch_size: Streaming only: items per sampling call (default: the source's, or 256).
        features: ``{column: datasets feature}`` overriding the inferred ones; required
            when streaming from a buffer that is still empty.
        n_shards: ``ranks="per_rank"`` only: shards of the stream, taken whole by each
            DataLoader worker and rank; a pass draws ``num_batches`` in total.
            Default: ``min(num_batches, 8)``.
        ranks: Streaming only. ``"identical"`` (default): every process draws the same
            stream, batch ``j`` of pass ``k`` seeded from ``(seed, k, j)``; required by
            ``GRPOTrainer``. ``"per_rank"``: each process and worker draws its own stream
            (a buffer per rank, for SFT / DPO); not for group trainers on several
            processes (docs/trl.md).
        seed: ``ranks="identical"`` only: the stream's seed (default 0).

    Returns:
        ``datasets.IterableDataset`` (streaming) or ``datasets.Dataset``.

    Raises:
        ImportError: Without the ``hf`` extra (``pip install "rb-lightning[hf]"``).
        UsageError: ``ranks`` / ``seed`` / ``n_shards`` that do not fit together.

    Examples:
        >>> import torch
        >>> from tensordict import NonTensorStack, TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> _ = rb.extend(TensorDict({
        ...     "input_ids": torch.arange(6).reshape(3, 2),
        ...     "meta": {"score": torch.tensor([0.5, 1.0, 1.5])},
        ...     "prompt": NonTensorStack("a", "b", "c"),
        ... }, batch_size=[3]))
        >>> to_hf_dataset(rb, streaming=False)[1]
        {'input_ids': [2, 3], 'meta.score': 1.0, 'prompt': 'b'}
        >>> ds = to_hf_dataset(rb, batch_size=2, num_batches=3, seed=7)
        >>> ds.features["input_ids"], sum(1 for _ in ds)
        (List(Value('int64'), length=2), 6)
    """
    require_hf()
    if isinstance(source, (str, os.PathLike)):
        from rb_lightning.buffers.reader import open_saved_buffer

        source = open_saved_buffer(source)
    given = _export_defaults(source)
    keys = given.keys if keys is None else keys
    num_batches = given.num_batches if num_batches is _UNSET else num_batches
    streaming = given.streaming if streaming is None else streaming
    plan = _plan(given, batch_size, keys, num_batches)
    resolved, columns = _resolve_features(plan, features)
    if streaming:
        ranks, stream_seed = check_ranks(ranks, seed, n_shards)
        return stream_dataset(
            plan.new_stream(), plan.num_batches, resolved, columns, n_shards, ranks, stream_seed
        )
    if n_shards is not None:
        raise UsageError(
            "n_shards",
            "n_shards applies to streaming=True only; shard a snapshot with "
            "dataset.shard(...) or datasets.distributed.split_dataset_by_node.",
        )
    return _snapshot(plan, resolved, columns)


__all__ = ["DEFAULT_BATCH_SIZE", "SupportsHFExport", "to_hf_dataset"]
