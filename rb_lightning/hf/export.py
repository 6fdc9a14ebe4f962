"""Hand a replay buffer to Hugging Face ``datasets`` (and so to TRL trainers), and back.

:func:`to_hf_dataset` exports a buffer two ways:

* ``streaming=True``: a ``datasets.IterableDataset`` that samples the live
  buffer, batch by batch (online training: new items are seen as they land);
* ``streaming=False``: a ``datasets.Dataset``, an Arrow snapshot of the
  buffer's current content in storage order, every item once.

Both convert whole sampled batches / storage slices column by column into
Arrow arrays (no per-item Python), declare their features up front (so int64
token ids stay int64 and strings arrive as ``str``) and never hash the buffer
for a fingerprint. Nested keys become ``"a.b"`` columns, as in
:class:`~rb_lightning.ReplayBufferDataset`.

:func:`from_hf_dataset` goes the other way: a ``datasets.Dataset`` (e.g. made
by a TRL script) into a replay buffer for Lightning.

This module imports ``datasets`` and ``pyarrow`` when its functions are
called, never at ``import rb_lightning``.

Examples:
    >>> import torch
    >>> from tensordict import NonTensorData, NonTensorStack, TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.hf.export import to_hf_dataset
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> _ = rb.extend(TensorDict({
    ...     "input_ids": torch.arange(6).reshape(3, 2),
    ...     "meta": {"score": torch.tensor([0.5, 1.0, 1.5])},
    ...     "prompt": NonTensorStack("a", "b", "c"),
    ... }, batch_size=[3]))
    >>> snapshot = to_hf_dataset(rb, streaming=False)
    >>> snapshot[1]
    {'input_ids': [2, 3], 'meta.score': 1.0, 'prompt': 'b'}
    >>> snapshot.features["input_ids"]
    List(Value('int64'), length=2)
    >>> stream = to_hf_dataset(rb, batch_size=2, num_batches=2)
    >>> len(list(stream))
    4
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict
from tensordict.utils import NestedKey
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorStorage

from rb_lightning.columns import (
    KEY_SEPARATOR,
    check_unique_names,
    column,
    flat_name,
    leaf_keys,
    normalize_key,
)
from rb_lightning.columns import columns as batch_columns
from rb_lightning.errors import ArgumentTypeError, MissingKeyError, UsageError
from rb_lightning.stream.handles import resolve_buffer
from rb_lightning.stream.sampling import SAMPLER_INFO_KEYS, BufferStream
from rb_lightning.stream.sharding import Shard, current_shard
from rb_lightning.validation import check_keys, check_positive_int, check_replay_buffer

if TYPE_CHECKING:  # pragma: no cover
    import datasets
    import pyarrow as pa

logger = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "rb-lightning[hf]"'
#: Items sampled per call in a stream built from a bare ``ReplayBuffer``.
DEFAULT_BATCH_SIZE = 256
#: Storage slots read per slice when snapshotting or filling a buffer.
CHUNK_SIZE = 8_192
#: Shards of an unbounded ``ranks="per_rank"`` stream: enough for DataLoader workers x ranks.
DEFAULT_STREAM_SHARDS = 8
#: Every process draws the same stream (same seed, same buffer content); Accelerate
#: hands each process its slice of each global batch.
IDENTICAL: Final = "identical"
#: Every process (and DataLoader worker) draws its own random stream from its own shards.
PER_RANK: Final = "per_rank"
RANKS = (IDENTICAL, PER_RANK)
#: Items read from storage to infer the features of a stream.
_PROBE_SIZE = 16
#: torchrl's bookkeeping, stored or sampled with the items (``TensorDictReplayBuffer``
#: writes ``index`` into every item): left out of an export unless ``keys`` names them.
BOOKKEEPING_KEYS: tuple[str, ...] = SAMPLER_INFO_KEYS
_UNSET: Any = object()

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


def _require_hf() -> tuple[Any, Any]:
    try:
        import datasets
        import pyarrow as pa
    except ImportError as err:
        raise ImportError(
            f"rb_lightning.hf needs the Hugging Face extra (datasets, pyarrow): {INSTALL_HINT}"
        ) from err
    return datasets, pa


# -- what to export ------------------------------------------------------------------------------
@dataclass
class _Plan:
    """The stream and the export arguments behind one export."""

    stream: BufferStream
    keys: list[NestedKey] | None
    num_batches: int | None

    @property
    def replay_buffer(self) -> ReplayBuffer:
        return self.stream.replay_buffer

    @property
    def batch_size(self) -> int:
        return self.stream.batch_size


def _plan(source: BufferStream, batch_size: Any, keys: Any, num_batches: Any) -> _Plan:
    # A stream of its own: the export seeds and counts it, the source's stays as it is.
    stream = BufferStream(
        source.replay_buffer,
        source.batch_size if batch_size is None else batch_size,
        min_size=source.min_size,
        wait_timeout=source.wait_timeout,
    )
    checked_keys = None if keys is None else check_keys(keys)
    if checked_keys is not None:
        check_unique_names(checked_keys)
    batches = None if num_batches is _UNSET else num_batches
    return _Plan(stream, checked_keys, check_positive_int(batches, "num_batches", allow_none=True))


# -- features ------------------------------------------------------------------------------------
def _tensor_feature(dtype: torch.dtype, dims: Sequence[int], fixed: bool) -> Any:
    datasets, _ = _require_hf()
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


def _column_feature(name: str, col: torch.Tensor | list[Any], fixed: bool) -> Any:
    datasets, pa = _require_hf()
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


def _empty_buffer_error() -> ValueError:
    return ValueError(
        "The replay buffer is empty, so its features cannot be read from it. Fill it first, "
        "or pass features=datasets.Features({...}) (e.g. for a stream that waits for a "
        "collector with min_size)."
    )


def infer_features(replay_buffer: ReplayBuffer, keys: Sequence[NestedKey] | None = None) -> Any:
    """The ``datasets.Features`` an export of ``replay_buffer`` will have.

    Read from the first stored items (the sampler is not used). Tensor
    storages have fixed shapes, so ``[B, L]`` tensors become ``List(...,
    length=L)``; list storages may hold ragged items, so their lists have no
    fixed length. Strings become ``Value("string")``. Without ``keys``: every
    stored key but torchrl's bookkeeping (:data:`BOOKKEEPING_KEYS`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict({"x": torch.zeros(2, 3), "n": torch.ones(2)}, [2]))
        >>> infer_features(rb)
        {'x': List(Value('float32'), length=3), 'n': Value('float32')}
    """
    datasets, _ = _require_hf()
    check_replay_buffer(replay_buffer)
    size = len(replay_buffer)
    if size == 0:
        raise _empty_buffer_error()
    probe = _read(replay_buffer, 0, min(size, _PROBE_SIZE))
    if keys is None:
        selected = [k for k in leaf_keys(probe) if k not in BOOKKEEPING_KEYS]
    else:
        selected = list(keys)
    check_unique_names(selected)
    members = resolve_buffer(replay_buffer).in_process_buffers()
    fixed = all(isinstance(rb.storage, TensorStorage) for rb in members)
    cols = batch_columns(probe, selected)
    return datasets.Features({n: _column_feature(n, c, fixed) for n, c in cols.items()})


def _read(replay_buffer: ReplayBuffer, start: int, stop: int) -> Any:
    """Stored items ``start:stop``; a mixture's with their ``"source"`` column."""
    return resolve_buffer(replay_buffer).read(start, stop)


def _resolve_features(plan: _Plan, features: Any) -> tuple[Any, dict[str, NestedKey]]:
    """Features of the export and the buffer key behind each column."""
    datasets, _ = _require_hf()
    if features is not None and not isinstance(features, Mapping):
        raise ArgumentTypeError(
            "features",
            f"features must be a datasets.Features or a dict {{column: feature}}, got "
            f"{type(features).__name__}.",
        )
    if len(plan.replay_buffer) == 0:
        if not features:
            raise _empty_buffer_error()
        keys = plan.keys or [_key_of(name) for name in features]
        resolved = datasets.Features(dict(features))
    else:
        resolved = infer_features(plan.replay_buffer, plan.keys)
        keys = plan.keys or [_key_of(name) for name in resolved]
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


def _key_of(name: str) -> NestedKey:
    parts = tuple(name.split(KEY_SEPARATOR))
    return normalize_key(parts)


# -- columns to Arrow ----------------------------------------------------------------------------
def _numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.contiguous().numpy()


def _nest(values: pa.Array, dims: Sequence[int]) -> pa.Array:
    _, pa = _require_hf()
    for size in reversed(dims):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


def _arrow_column(name: str, col: torch.Tensor | list[Any], arrow_type: pa.DataType) -> pa.Array:
    _, pa = _require_hf()
    try:
        if isinstance(col, torch.Tensor):
            array = _numpy(col)
            values = _nest(pa.array(array.reshape(-1)), array.shape[1:])
        elif col and all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in col):
            # Ragged items: one flat value buffer plus offsets, no per-item Python lists.
            parts = [_numpy(v) for v in col]
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


def _arrow_table(batch: Any, columns: Mapping[str, NestedKey], schema: pa.Schema) -> pa.Table:
    _, pa = _require_hf()
    arrays = [
        _arrow_column(name, column(batch, key), schema.field(name).type)
        for name, key in columns.items()
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


# -- streaming -----------------------------------------------------------------------------------
@dataclass
class _StreamSpec:
    """Everything a shard generator needs; pickled into DataLoader workers."""

    sampler: BufferStream
    columns: dict[str, NestedKey]
    schema: Any
    num_batches: int | None
    n_shards: int
    ranks: str = PER_RANK
    seed: int = 0
    #: Passes started in this process (identical streams: part of each batch's seed).
    passes: int = 0


def _batch_seed(seed: int, pass_: int, batch: int) -> int:
    """A seed for one batch of an identical stream: a function of its position only."""
    state = np.random.SeedSequence([seed, pass_, batch]).generate_state(1, np.uint64)[0]
    return int(state) & (2**63 - 1)


def _sampled_tables(shards: list[int], spec: tuple[_StreamSpec]) -> Iterator[tuple[str, Any]]:
    """Generate one Arrow table per sampling call for the given shards."""
    (spec_,) = spec
    sampler = spec_.sampler
    shard = current_shard()
    identical = spec_.ranks == IDENTICAL
    if identical:
        pass_ = spec_.passes
        spec_.passes += 1
    else:
        # A copy of the buffer in a worker process or on another rank: draw its own stream.
        sampler.seed_replica(shard)
    sampler.wait_until_ready()
    budget = None
    if spec_.num_batches is not None:
        total = spec_.num_batches
        budget = sum(Shard(worker_id=s, num_workers=spec_.n_shards).share(total) for s in shards)
    for drawn in count():
        if budget is not None and drawn >= budget:
            return
        if identical:
            # Re-seeded per batch, from (seed, pass, batch) only: every process draws the
            # same batch whatever else sampled this buffer in between.
            sampler.reseed(_batch_seed(spec_.seed, pass_, drawn))
        batch = sampler.sample()
        yield f"{shards[0]}_{drawn}", _arrow_table(batch, spec_.columns, spec_.schema)


def _check_ranks(
    ranks: Any, seed: Any, n_shards: Any
) -> tuple[Literal["identical", "per_rank"], int]:
    if ranks not in RANKS:
        raise UsageError(
            "ranks",
            f"ranks must be 'identical' (every process draws the same stream and takes its slice "
            f"of each global batch) or 'per_rank' (each process its own stream), got {ranks!r}.",
        )
    if ranks == PER_RANK:
        if seed is not None:
            raise UsageError(
                "seed",
                "seed applies to ranks='identical' streams; ranks='per_rank' streams are seeded "
                "per rank and DataLoader worker from torch's RNG. Drop seed, or pass "
                "ranks='identical'.",
            )
        return ranks, 0
    if n_shards not in (None, 1):
        raise UsageError(
            "n_shards",
            f"n_shards={n_shards} with ranks='identical': an identical stream is one shard, so that "
            "Accelerate slices each global batch across processes instead of giving each process "
            "whole shards. Drop n_shards, or pass ranks='per_rank' to shard the stream.",
        )
    if seed is None:
        return ranks, 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError("seed", f"seed must be a non-negative int, got {seed!r}.")
    return ranks, seed


def _check_identical_source(replay_buffer: ReplayBuffer) -> None:
    """An identical stream needs draws that depend on the generator and the content only."""
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSampler,
        RandomSampler,
        SamplerWithoutReplacement,
        SliceSampler,
    )

    handle = resolve_buffer(replay_buffer)
    if not handle.samples_in_process:
        raise UsageError(
            "ranks",
            "ranks='identical' needs a local copy of the buffer on every process, but this buffer "
            "is served by a Ray actor that all processes share, so each process would draw "
            "different batches. Dump it once and load_buffer the dump on every process, or "
            "export a snapshot with streaming=False.",
        )
    stateless = (RandomSampler, PrioritizedSampler, SliceSampler)
    for sampler in [rb.sampler for rb in handle.in_process_buffers()]:
        if isinstance(sampler, SamplerWithoutReplacement) or not isinstance(sampler, stateless):
            raise UsageError(
                "ranks",
                f"ranks='identical' re-seeds the buffer before every batch so that all processes draw "
                f"the same one, but {type(sampler).__name__} also draws from its own state (what it "
                "already handed out), which a read-ahead on one process can advance more than on "
                "another. To read every item once, export a snapshot (streaming=False); to sample, "
                "use RandomSampler or PrioritizedSampler; or pass ranks='per_rank' (not for GRPO on "
                "several processes).",
            )


def _stream(
    plan: _Plan,
    features: Any,
    columns: dict[str, NestedKey],
    n_shards: Any,
    ranks: str,
    seed: int,
) -> Any:
    datasets, _ = _require_hf()
    from datasets.iterable_dataset import ArrowExamplesIterable

    if ranks == IDENTICAL:
        _check_identical_source(plan.replay_buffer)
        n_shards = 1
    elif n_shards is None:
        n_shards = DEFAULT_STREAM_SHARDS
        if plan.num_batches is not None:
            n_shards = min(plan.num_batches, DEFAULT_STREAM_SHARDS)
    n_shards = check_positive_int(n_shards, "n_shards")
    if plan.num_batches is not None and n_shards > plan.num_batches:
        raise UsageError(
            "n_shards",
            f"n_shards={n_shards} exceeds num_batches={plan.num_batches}: some shards would be "
            "empty. Lower n_shards, or raise num_batches.",
        )
    spec = _StreamSpec(
        plan.stream, columns, features.arrow_schema, plan.num_batches, n_shards, ranks, seed
    )
    # Lists in the kwargs are shards for `datasets`; everything else goes in a tuple.
    iterable = ArrowExamplesIterable(
        _sampled_tables, {"shards": list(range(n_shards)), "spec": (spec,)}
    )
    if plan.num_batches is None:
        description = (
            "Unbounded stream sampled from a live torchrl replay buffer: trainers need "
            "max_steps (e.g. TrainingArguments(max_steps=...)) to stop."
        )
        logger.info("to_hf_dataset: %s", description)
    else:
        description = (
            f"{plan.num_batches} batches of {plan.batch_size} items sampled from a torchrl "
            "replay buffer per pass; trainers still need max_steps (no __len__)."
        )
    info = datasets.DatasetInfo(description=description, features=features)
    return datasets.IterableDataset(iterable, info=info)


# -- snapshot ------------------------------------------------------------------------------------
def _snapshot(plan: _Plan, features: Any, columns: dict[str, NestedKey]) -> Any:
    datasets, pa = _require_hf()
    from datasets.fingerprint import generate_random_fingerprint
    from datasets.table import InMemoryTable

    rb = plan.replay_buffer
    schema = features.arrow_schema
    size = len(rb)
    # Slices, not index tensors: indexing a NonTensorStack with a tensor clones every item.
    tables = [
        _arrow_table(_read(rb, start, min(start + CHUNK_SIZE, size)), columns, schema)
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
    ``hf_export_defaults()`` returns ``{"stream": BufferStream, ...}`` with optional
    ``keys``, ``num_batches`` and ``streaming``, which :func:`to_hf_dataset`'s own
    arguments override. (Their ``as_hf_dataset(**options)`` is
    ``to_hf_dataset(self, **options)``.)
    """

    def hf_export_defaults(self) -> dict[str, Any]: ...


def _export_defaults(source: Any) -> dict[str, Any]:
    """``{"stream": BufferStream, ...}``: what ``source`` samples unless told otherwise."""
    if isinstance(source, ReplayBuffer):
        return {"stream": BufferStream(source, DEFAULT_BATCH_SIZE)}
    if isinstance(source, BufferStream):
        return {"stream": source}
    defaults = getattr(source, "hf_export_defaults", None)
    if not callable(defaults):
        raise ArgumentTypeError(
            "source",
            "to_hf_dataset(source) takes a torchrl ReplayBuffer, a BufferStream, a saved run or "
            "dump (a path), or a dataset or DataModule of rb_lightning (ReplayBufferDataset, "
            f"ReplayBufferBatchDataset, ReplayBufferPassDataset, ReplayBufferDataModule), got "
            f"{type(source).__name__}.",
        )
    return dict(defaults())


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
            :class:`~rb_lightning.ReplayBufferDataModule` (:class:`SupportsHFExport`:
            its buffer, ``batch_size``, ``keys``, ``num_batches``, ``min_size``
            and snapshot-or-stream are the defaults of the arguments below); or the path of a saved buffer: a Lightning run's
            directory or ``.ckpt``, a dump (read by
            :func:`rb_lightning.saved.open_saved_buffer`; all members or ranks
            of a mixture or DDP checkpoint, with a ``"source"`` column).

    Keyword Args:
        streaming: ``True``: a ``datasets.IterableDataset`` sampling the live
            buffer (items written later are seen). ``False``: a
            ``datasets.Dataset`` snapshot of the current content, in storage
            order, each item once. Default: the source's (a
            ``ReplayBufferPassDataset`` is a snapshot), else ``True``.
        keys: Buffer keys to export (nested keys as tuples); default: all but
            torchrl's bookkeeping (``index``, ``priority_weight``:
            :data:`BOOKKEEPING_KEYS`), which a trainer does not read.
        num_batches: Streaming only: sampling calls per pass. ``None`` is an
            unbounded stream: the trainer must stop it with ``max_steps``.
            Default: the source's (``None`` for a bare ``ReplayBuffer``).
        batch_size: Streaming only: items per sampling call (default: the
            source's, or 256).
        features: ``{column: datasets feature}`` overriding the inferred ones
            (columns are named ``"a.b"`` for nested keys). Required when
            streaming from a buffer that is still empty.
        n_shards: Streaming with ``ranks="per_rank"`` only: shards of the
            stream. Each DataLoader worker and each rank
            (``datasets.distributed.split_dataset_by_node``, Accelerate when
            ``n_shards >= num_processes``) takes whole shards, and the
            ``num_batches`` of a pass are divided between shards, so a pass
            draws ``num_batches`` batches in total whatever the number of
            workers. Default: ``min(num_batches, 8)``.
        ranks: Streaming only: what several processes (Accelerate,
            ``torchrun``) read. ``"identical"`` (default): every process draws
            the same stream, one shard, batch ``j`` of pass ``k`` sampled with
            a generator seeded from ``(seed, k, j)``; given the same buffer
            content on every process (load one dump on each), Accelerate's
            per-process slice of each global batch gives disjoint,
            group-consistent rows: right for every TRL trainer, required by
            ``GRPOTrainer``. ``"per_rank"``: each process and DataLoader worker
            draws its own random stream from its own shards (several workers
            read in parallel; right when each rank holds its own buffer, for
            SFT / DPO / ``Trainer``). Not for a group trainer (GRPO, RLOO) on
            several processes: it slices each group across processes, so its
            groups would mix prompts (docs/trl.md).
        seed: ``ranks="identical"`` only: the stream's seed (default 0); give
            every process the same.

    Returns:
        ``datasets.IterableDataset`` (streaming) or ``datasets.Dataset``.

    Raises:
        ImportError: Without the ``hf`` extra (``pip install "rb-lightning[hf]"``).
        UsageError: ``ranks`` / ``seed`` / ``n_shards`` that do not fit together.

    Notes:
        Trainers need ``max_steps`` with a streaming dataset (it has no
        length). See docs/trl.md for which ``ranks`` each trainer needs.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> _ = rb.extend(TensorDict({"input_ids": torch.zeros(10, 4, dtype=torch.long)}, [10]))
        >>> ds = to_hf_dataset(rb, streaming=True, batch_size=4, num_batches=3)
        >>> ds.features["input_ids"], sum(1 for _ in ds)
        (List(Value('int64'), length=4), 12)

        Every process building the same export of the same content reads the same rows:

        >>> _ = rb.extend(TensorDict({"input_ids": torch.arange(40).reshape(10, 4)}, [10]))
        >>> rows = lambda d: [r["input_ids"][0] for r in d]
        >>> rows(to_hf_dataset(rb, batch_size=4, num_batches=2, seed=7)) == rows(
        ...     to_hf_dataset(rb, batch_size=4, num_batches=2, seed=7))
        True
    """
    _require_hf()
    if isinstance(source, (str, os.PathLike)):
        from rb_lightning.saved import open_saved_buffer

        source = open_saved_buffer(source).replay_buffer
    given = _export_defaults(source)
    keys = given.get("keys") if keys is None else keys
    num_batches = given.get("num_batches", _UNSET) if num_batches is _UNSET else num_batches
    streaming = given.get("streaming", True) if streaming is None else streaming
    plan = _plan(given["stream"], batch_size, keys, num_batches)
    resolved, columns = _resolve_features(plan, features)
    if streaming:
        ranks, stream_seed = _check_ranks(ranks, seed, n_shards)
        return _stream(plan, resolved, columns, n_shards, ranks, stream_seed)
    if n_shards is not None:
        raise UsageError(
            "n_shards",
            "n_shards applies to streaming=True only; shard a snapshot with "
            "dataset.shard(...) or datasets.distributed.split_dataset_by_node.",
        )
    return _snapshot(plan, resolved, columns)


def _arrow_to_value(name: str, array: pa.Array) -> torch.Tensor | NonTensorStack:
    _, pa = _require_hf()
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
    datasets, _ = _require_hf()
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
            items.set(_key_of(name), _arrow_to_value(name, array))
        replay_buffer.extend(items)
    return replay_buffer


__all__ = [
    "IDENTICAL",
    "PER_RANK",
    "BOOKKEEPING_KEYS",
    "SupportsHFExport",
    "from_hf_dataset",
    "infer_features",
    "to_hf_dataset",
]
