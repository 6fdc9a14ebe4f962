"""Buffer-backed ``IterableDataset`` classes.

Two views of the same sampling stream:

* :class:`ReplayBufferDataset` yields one flat ``dict`` per item. It is a
  drop-in replacement for torchrl's ``TorchRLBufferDataset`` (same arguments,
  same output), for consumers that collate items themselves
  (``transformers.Trainer``, a ``DataLoader`` with ``batch_size``).
* :class:`ReplayBufferBatchDataset` yields each sampled batch whole (a
  ``TensorDict``), with no split and no re-collation. Load it with
  :func:`batch_loader`; it is what
  :class:`~rb_lightning.ReplayBufferDataModule` uses.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch.utils.data import IterableDataset
from torchrl.data import ReplayBuffer

from rb_lightning import columns
from rb_lightning.errors import ArgumentTypeError, MissingKeyError
from rb_lightning.stream import exporters
from rb_lightning.stream.sampling import BufferStream
from rb_lightning.stream.sharding import Shard, current_shard, draw_base_seed, one_order_draws
from rb_lightning.stream.state import StreamCursor
from rb_lightning.validation import (
    check_device,
    check_keys,
    check_positive_int,
    check_replay_buffer,
)

logger = logging.getLogger(__name__)


class _SampledDataset(IterableDataset):
    """Shared part of the sampled views: key selection, epochs and shares, on a :class:`BufferStream`."""

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int,
        *,
        keys: list[NestedKey] | None = None,
        device: torch.device | str | None = None,
        num_batches: int | None = 1,
        min_size: int | None = None,
        wait_timeout: float = 600.0,
    ) -> None:
        self._stream = BufferStream(
            replay_buffer, batch_size, min_size=min_size, wait_timeout=wait_timeout
        )
        self._keys = check_keys(keys)
        self._device = check_device(device)
        self._num_batches = check_positive_int(num_batches, "num_batches", allow_none=True)
        if self._keys is not None:
            columns.check_unique_names(self._keys)
        self._warned_missing: set[NestedKey] = set()
        self._checked_names = False
        #: Batches drawn by iterators of this object in this process (statistics only; the
        #: resumable count of a training stream is :attr:`StreamState.batches_served`).
        self.batches_served = 0
        self._cursor: StreamCursor | None = None

    # -- public read-only properties ---------------------------------------------------------
    @property
    def stream(self) -> BufferStream:
        """The :class:`~rb_lightning.stream.BufferStream` this dataset samples through."""
        return self._stream

    @property
    def replay_buffer(self) -> ReplayBuffer:
        """The wrapped buffer."""
        return self._stream.replay_buffer

    @property
    def batch_size(self) -> int:
        """Items drawn per sampling call."""
        return self._stream.batch_size

    @property
    def num_batches(self) -> int | None:
        """Sampling calls per pass over the dataset (``None``: unbounded)."""
        return self._num_batches

    @property
    def keys(self) -> list[NestedKey] | None:
        """Selected keys, or ``None`` for all leaves."""
        return self._keys

    def hf_export_defaults(self) -> exporters.ExportDefaults:
        """What :func:`~rb_lightning.hf.to_hf_dataset` samples when given this dataset."""
        stream = self._stream
        return exporters.ExportDefaults(
            stream.replay_buffer,
            stream.batch_size,
            keys=self._keys,
            num_batches=self._num_batches,
            min_size=stream.min_size,
            wait_timeout=stream.wait_timeout,
        )

    def as_hf_dataset(self, **options: Any) -> Any:
        """This dataset as a Hugging Face dataset: ``to_hf_dataset(self, **options)`` (needs the ``hf`` extra).

        Its buffer, ``batch_size``, ``keys``, ``num_batches``, ``min_size`` and ``wait_timeout``
        are the defaults; ``options`` override them (``streaming=False``: a snapshot).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> from rb_lightning import ReplayBufferDataset
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
            >>> _ = rb.extend(TensorDict({"x": torch.arange(8)}, batch_size=[8]))
            >>> len(list(ReplayBufferDataset(rb, batch_size=4, num_batches=2).as_hf_dataset()))
            8
        """
        return exporters.export("hf", self, **options)

    # -- iteration --------------------------------------------------------------------------
    def _batches_for(self, shard: Shard) -> int | None:
        if self._num_batches is None:
            return None
        return shard.share(self._num_batches)

    def _select_keys(self, batch: Any) -> list[NestedKey]:
        available = columns.leaf_keys(batch)
        if self._keys is None:
            if not self._checked_names:
                columns.check_unique_names(available)
                self._checked_names = True
            return available
        present = set(available)
        selected = []
        for key in self._keys:
            if key in present:
                selected.append(key)
            elif key not in self._warned_missing:
                self._warned_missing.add(key)
                logger.warning(
                    "%s: key %r not found in the sampled batch (available: %s); skipping it.",
                    type(self).__name__,
                    key,
                    available,
                )
        if not selected:
            # Every requested key is missing: yielding empty items would be a silent wrong result.
            raise MissingKeyError(
                "keys",
                f"None of keys={self._keys!r} is in the sampled batch, which has {available!r}. "
                "Fix the names (nested keys are tuples, ('next', 'reward')) or pass keys=None.",
            )
        return selected

    def _batches(self) -> Iterator[Any]:
        shard = current_shard()
        if shard.is_replica and self._stream.draws_epochs():
            yield from self._batches_of_one_order(shard)
            return
        if self._cursor is None:
            count, redraw = self._batches_for(shard), 0
            self._stream.seed_replica(shard)
        else:
            count, redraw = self._enter_epoch(shard, self._cursor)
        self._stream.wait_until_ready()
        for _ in range(redraw):
            self._stream.sample()  # what this worker's role drew before the checkpoint: dropped
        drawn = 0
        while count is None or drawn < count:
            yield self._hand_out()
            drawn += 1

    def _batches_of_one_order(self, shard: Shard) -> Iterator[Any]:
        """Without replacement, every copy seeds one generator and takes its own batches of
        that order (:func:`~rb_lightning.stream.sharding.one_order_draws`)."""
        position, restored = 0, False
        if self._cursor is not None:
            stream_seed, epoch, position = self._cursor.read()
            # In the training process a resumed epoch continues the restored sampler.
            restored = shard.worker_seed is None and position > 0
            seed = Shard().epoch_seed(stream_seed, epoch)
        elif shard.worker_seed is not None:
            seed = shard.worker_seed - shard.worker_id  # the loader's base seed: one per epoch
        else:
            seed = draw_base_seed()  # the same on every rank after seed_everything
        if not restored:  # each epoch of the loader is a new order
            self._stream.restart_epoch(seed % (2**63 - 1))
        self._stream.wait_until_ready()
        for skip in one_order_draws(shard, position, self._num_batches, restored=restored):
            self._stream.skip(skip)
            yield self._hand_out()

    def _enter_epoch(self, shard: Shard, cursor: StreamCursor) -> tuple[int | None, int]:
        """Seed this copy for the cursor's epoch; return (batches to yield, batches to redraw).

        A worker's stream is a function of (stream seed, epoch, rank, role), so a resumed epoch
        is rebuilt by redrawing what was consumed; torch deals batches round-robin from worker 0,
        so after ``position`` batches worker ``w`` plays role ``(w + position) % num_workers``. The
        training process's restored generator already continues the epoch: nothing is redrawn.
        """
        seed, epoch, position = cursor.read()
        if shard.worker_seed is not None:  # a DataLoader worker
            role = (shard.worker_id + position) % shard.num_workers
            total = self._batches_for(dataclasses.replace(shard, worker_id=role))
            redraw = -(-(position - role) // shard.num_workers) if position > role else 0
            self._stream.reseed(shard.epoch_seed(seed, epoch, role))  # a remote buffer: kept
            return (None if total is None else max(total - redraw, 0)), redraw
        count = None if self._num_batches is None else max(self._num_batches - position, 0)
        if position == 0 and shard.is_replica:
            self._stream.reseed(shard.epoch_seed(seed, epoch))
        return count, 0

    def _hand_out(self) -> Any:
        # Kept out of the generator's locals: the batch it yielded must not stay
        # alive while the next one is sampled (a batch of extra peak memory).
        batch = self._stream.sample()
        self.batches_served += 1
        return batch

    def __len__(self) -> int:
        if self._num_batches is None:
            # TypeError is what len() raises for sized-less objects; Lightning reads it as "no length".
            raise TypeError(f"{type(self).__name__} with num_batches=None is an unbounded stream.")
        return self._num_batches * self._items_per_batch()

    def _items_per_batch(self) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        keys = self._keys if self._keys is not None else "<all>"
        return (
            f"{type(self).__name__}(replay_buffer={type(self.replay_buffer).__name__}"
            f"(len={len(self.replay_buffer)}), batch_size={self.batch_size}, keys={keys}, "
            f"device={self._device}, num_batches={self._num_batches})"
        )


class ReplayBufferDataset(_SampledDataset):
    """Per-item view of a replay buffer; drop-in for torchrl's ``TorchRLBufferDataset``.

    Each sampling call draws ``batch_size`` items and yields them one by one as flat dicts:
    nested keys become ``"key0.key1"``, strings plain values, tensors lose the batch
    dimension; a ``PrioritizedSampler`` adds ``"index"`` and ``"priority_weight"``. Each
    DataLoader worker and DDP rank re-seeds its copy (without replacement they deal out one
    order); a worker sees later writes only with shared (``rb.share()``) or memory-mapped storage.

    Args:
        replay_buffer: The torchrl ``ReplayBuffer`` to sample from.
        batch_size: Items drawn per sampling call.

    Keyword Args:
        keys: Keys to keep (nested keys as tuples); ``None`` keeps every leaf. A missing key
            is warned about once and skipped.
        device: Move tensors to this device before yielding.
        num_batches: Sampling calls per pass, split across workers; ``None``: unbounded
            (the consumer stops it, ``max_steps``).
        min_size: Wait until the buffer holds this many items before the first sample;
            without it an empty buffer raises at once.
        wait_timeout: Seconds to wait for ``min_size``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import ReplayBuffer, ListStorage
        >>> from rb_lightning import ReplayBufferDataset
        >>> rb = ReplayBuffer(storage=ListStorage(100), batch_size=4)
        >>> for _ in range(10):
        ...     _ = rb.add(TensorDict({"input_ids": torch.randint(0, 100, (8,))}, batch_size=[]))
        >>> next(iter(ReplayBufferDataset(rb, batch_size=4)))["input_ids"].shape
        torch.Size([8])
    """

    def _items_per_batch(self) -> int:
        return self.batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self._batches():
            cols = columns.columns(batch, self._select_keys(batch))
            yield from columns.rows(cols, columns.batch_length(batch), self._device)


class ReplayBufferBatchDataset(_SampledDataset):
    """Whole-batch view of a replay buffer: one ``TensorDict`` per sampling call, no re-collation.

    Load it with :func:`batch_loader`. Takes the arguments of :class:`ReplayBufferDataset`, plus:

    Keyword Args:
        flatten: Yield a flat ``dict`` (``"key0.key1"`` names) instead of a ``TensorDict``.
        cursor: A :class:`StreamCursor` that makes the stream resumable (each epoch's seeds
            and the batches consumed come from it); the DataModule passes one.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from rb_lightning import ReplayBufferBatchDataset, batch_loader
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> _ = rb.extend(TensorDict({"obs": torch.randn(50, 3)}, batch_size=[50]))
        >>> loader = batch_loader(ReplayBufferBatchDataset(rb, 16, num_batches=2))
        >>> [batch["obs"].shape for batch in loader]
        [torch.Size([16, 3]), torch.Size([16, 3])]
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int,
        *,
        keys: list[NestedKey] | None = None,
        device: torch.device | str | None = None,
        num_batches: int | None = 1,
        min_size: int | None = None,
        wait_timeout: float = 600.0,
        flatten: bool = False,
        cursor: StreamCursor | None = None,
    ) -> None:
        super().__init__(
            replay_buffer,
            batch_size,
            keys=keys,
            device=device,
            num_batches=num_batches,
            min_size=min_size,
            wait_timeout=wait_timeout,
        )
        self._flatten = bool(flatten)
        if cursor is not None and not isinstance(cursor, StreamCursor):
            raise ArgumentTypeError(
                "cursor", f"cursor must be a StreamCursor, got {type(cursor).__name__}."
            )
        self._cursor = cursor

    def _items_per_batch(self) -> int:
        return 1

    def _shape_batch(self, batch: Any) -> Any:
        if not self._flatten and self._keys is None and isinstance(batch, TensorDictBase):
            # The batch goes out whole: no key scan needed (it costs ~8 us a batch).
            return batch if self._device is None else batch.to(self._device)
        keys = self._select_keys(batch)
        if self._flatten or not isinstance(batch, TensorDictBase):
            cols = columns.columns(batch, keys)
            if self._device is not None:
                cols = {
                    k: v.to(self._device) if isinstance(v, torch.Tensor) else v
                    for k, v in cols.items()
                }
            return cols
        if self._keys is not None:
            batch = batch.select(*keys)
        if self._device is not None:
            batch = batch.to(self._device)
        return batch

    def __iter__(self) -> Iterator[Any]:
        # map() holds no reference to the batch it handed out last (a for-loop would).
        yield from map(self._shape_batch, self._batches())


class ReplayBufferPassDataset(IterableDataset):
    """One pass over a buffer's content, in storage order: every stored item exactly once.

    For validation, test and snapshots: batches of consecutive slots are dealt round-robin to
    workers and ranks. The buffer is not sampled (its sampler and RNG stay untouched).

    Args:
        replay_buffer: The buffer to read.
        batch_size: Items per yielded batch (the last one may be smaller).

    Keyword Args:
        keys: Keys to keep (nested keys as tuples). ``None`` keeps every leaf.
        flatten: Yield flat dicts instead of ``TensorDict`` batches.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from rb_lightning import ReplayBufferPassDataset
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(5)}, batch_size=[5]))
        >>> [b["x"].tolist() for b in ReplayBufferPassDataset(rb, batch_size=2)]
        [[0, 1], [2, 3], [4]]
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int,
        *,
        keys: list[NestedKey] | None = None,
        flatten: bool = False,
    ) -> None:
        self._replay_buffer = check_replay_buffer(replay_buffer)
        self._batch_size = check_positive_int(batch_size, "batch_size")
        self._keys = check_keys(keys)
        self._flatten = bool(flatten)

    @property
    def replay_buffer(self) -> ReplayBuffer:
        """The wrapped buffer."""
        return self._replay_buffer

    def __len__(self) -> int:
        return -(-len(self._replay_buffer) // self._batch_size)

    def hf_export_defaults(self) -> exporters.ExportDefaults:
        """What :func:`~rb_lightning.hf.to_hf_dataset` exports of this pass: a snapshot."""
        return exporters.ExportDefaults(
            self._replay_buffer, self._batch_size, keys=self._keys, streaming=False
        )

    def as_hf_dataset(self, **options: Any) -> Any:
        """This pass as a ``datasets.Dataset`` snapshot: ``to_hf_dataset(self, **options)`` (needs the ``hf`` extra).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> _ = rb.extend(TensorDict({"x": torch.arange(5)}, batch_size=[5]))
            >>> [row["x"] for row in ReplayBufferPassDataset(rb, batch_size=2).as_hf_dataset()]
            [0, 1, 2, 3, 4]
        """
        return exporters.export("hf", self, **options)

    def __iter__(self) -> Iterator[Any]:
        shard = current_shard()
        copies = shard.world_size * shard.num_workers
        me = shard.rank * shard.num_workers + shard.worker_id
        size = len(self._replay_buffer)
        for number, start in enumerate(range(0, size, self._batch_size)):
            if number % copies != me:
                continue
            index = torch.arange(start, min(start + self._batch_size, size))
            batch = self._replay_buffer[index]
            keys = columns.leaf_keys(batch) if self._keys is None else self._keys
            if self._flatten or not isinstance(batch, TensorDictBase):
                yield columns.columns(batch, keys)
            else:
                yield batch if self._keys is None else batch.select(*keys)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={type(self._replay_buffer).__name__}"
            f"(len={len(self._replay_buffer)}), batch_size={self._batch_size})"
        )


__all__ = ["ReplayBufferBatchDataset", "ReplayBufferDataset", "ReplayBufferPassDataset"]
