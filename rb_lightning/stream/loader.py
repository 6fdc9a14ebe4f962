"""Loaders that hand whole sampled batches to a training loop.

:func:`batch_loader` wraps a dataset that yields whole batches;
:class:`ResumableBatchLoader` also reports and restores the stream position
(:class:`~rb_lightning.stream.state.StreamState`) through Lightning's
``state_dict`` / ``load_state_dict`` of the train loader.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from rb_lightning.buffers.handles import BufferHandle
from rb_lightning.errors import ArgumentTypeError, UsageError
from rb_lightning.stream.device_prefetch import CopyEngine, DevicePrefetcher, check_device_storage
from rb_lightning.stream.state import StreamState
from rb_lightning.validation import check_non_negative_int, check_positive_int


def keep_batch(batch: Any) -> Any:
    """``collate_fn`` for loaders of whole batches: the batch unchanged (``default_convert`` would break a ``TensorDict`` apart)."""
    return batch


class _InProcessBatches:
    """Iterator of a :class:`_BatchLoader` without workers: the dataset's batches, collated."""

    def __init__(self, loader: DataLoader) -> None:
        # Draw the per-iterator seed a DataLoader iterator draws, so the global RNG
        # stream (which a buffer without its own generator samples from) is the same.
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        self._batches = iter(loader.dataset)
        self._collate = None if loader.collate_fn is keep_batch else loader.collate_fn

    def __iter__(self) -> _InProcessBatches:
        return self

    def __next__(self) -> Any:
        batch = next(self._batches)
        return batch if self._collate is None else self._collate(batch)

    def __reduce__(self) -> Any:
        # Like torch's loader iterators, an iterator in flight is not carried over
        # when pickled (Lightning drops those too): it unpickles as an empty one.
        return (iter, ((),))


_SIZED_ITERABLE_WARNING = r"Your `IterableDataset` has `__len__` defined"


class _BatchLoader(DataLoader):
    """The ``DataLoader`` :func:`batch_loader` returns; in-process it hands batches straight over (torch's iterator costs ~20 us a batch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Lightning warns that a sized IterableDataset may duplicate items across workers;
        # these datasets give each worker and rank its own stream, so it never applies here.
        warnings.filterwarnings("ignore", message=_SIZED_ITERABLE_WARNING)
        super().__init__(*args, **kwargs)

    # torch annotates DataLoader.__iter__ with its private _BaseDataLoaderIter, which no
    # subclass can return without re-implementing it; callers only use next().
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        direct = (
            self.num_workers == 0
            and not self.pin_memory
            and self.batch_size is None
            and isinstance(self.dataset, IterableDataset)
        )
        return _InProcessBatches(self) if direct else super().__iter__()


def batch_loader(dataset: IterableDataset, **loader_kwargs: Any) -> DataLoader:
    """A ``DataLoader`` for a dataset that yields whole batches (``batch_size=None``, ``collate_fn=keep_batch``; other arguments go to ``DataLoader``)."""
    return _BatchLoader(dataset, batch_size=None, collate_fn=keep_batch, **loader_kwargs)


@dataclass(frozen=True)
class LoaderOptions:
    """How batches reach the step: DataLoader workers, pinned memory, device prefetch,
    batches per ``rb.sample`` call.

    Checked when built; see :class:`~rb_lightning.ReplayBufferDataModule` for each.

    Examples:
        >>> LoaderOptions(num_workers=2).dataloader_kwargs()
        {'num_workers': 2, 'pin_memory': False, 'persistent_workers': False}
        >>> LoaderOptions(persistent_workers=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rb_lightning.errors.UsageError: persistent_workers=True needs num_workers > 0...
    """

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_to_device: bool | CopyEngine = False
    batches_per_draw: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "num_workers", check_non_negative_int(self.num_workers, "num_workers")
        )
        per_draw = check_positive_int(self.batches_per_draw, "batches_per_draw")
        object.__setattr__(self, "batches_per_draw", per_draw)
        if per_draw > 1 and self.num_workers > 0:
            raise UsageError(
                "batches_per_draw",
                f"batches_per_draw={per_draw} with num_workers={self.num_workers}: the "
                "batches a worker drew ahead could not be saved in a checkpoint. Use "
                "num_workers=0 (drawing several batches per call is the in-process way to "
                "cheaper sampling), or batches_per_draw=1.",
            )
        if self.persistent_workers and self.num_workers == 0:
            raise UsageError(
                "persistent_workers",
                "persistent_workers=True needs num_workers > 0: there are no workers to keep. "
                "Drop persistent_workers, or set num_workers.",
            )
        if not isinstance(self.prefetch_to_device, (bool, CopyEngine)):
            raise ArgumentTypeError(
                "prefetch_to_device",
                "prefetch_to_device must be True, False or a rb_lightning.stream.device_prefetch."
                f"CopyEngine, got {type(self.prefetch_to_device).__name__}.",
            )

    def dataloader_kwargs(self) -> dict[str, Any]:
        """The ``DataLoader`` arguments among these options."""
        return {
            "num_workers": self.num_workers,
            "pin_memory": bool(self.pin_memory),
            "persistent_workers": bool(self.persistent_workers),
        }


class _TrackedBatches:
    """Iterator of a :class:`ResumableBatchLoader`: replays restored batches, records each one."""

    def __init__(
        self,
        stream: StreamState,
        batches: Iterator[Any],
        replay: list[Any],
        prefetcher: DevicePrefetcher | None = None,
    ) -> None:
        self._stream = stream
        self._batches = batches
        self._replay = deque(replay)
        self._prefetcher = prefetcher

    def __iter__(self) -> _TrackedBatches:
        return self

    def __next__(self) -> Any:
        batch = self._replay.popleft() if self._replay else next(self._batches)
        self._stream.handed_out(batch)  # the host batch: what a checkpoint saves as read-ahead
        if self._prefetcher is not None:
            # Lightning reads one batch ahead: this copy runs while the current step runs.
            self._prefetcher.submit(batch)
        return batch

    def __reduce__(self) -> Any:
        return (iter, ((),))  # like _InProcessBatches: not carried over when pickled


class ResumableBatchLoader(_BatchLoader):
    """A :func:`batch_loader` over a stream position that its owner checkpoints.

    The owner (:class:`~rb_lightning.lightning.training.TrainingStream`) saves the position;
    the loader only says it is resumable, so Lightning does not warn about mid-epoch resumes.

    Args:
        dataset: A :class:`ReplayBufferBatchDataset` built with ``cursor=stream.cursor``.
        stream: The stream position this loader starts from and records each batch in.

    Keyword Args:
        prefetcher: A :class:`~rb_lightning.stream.device_prefetch.DevicePrefetcher` that
            starts each batch's device copy as it is handed out (``None``: none).
        **loader_kwargs: ``num_workers``, ``pin_memory``, ... as for :func:`batch_loader`.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        stream: StreamState,
        *,
        prefetcher: DevicePrefetcher | None = None,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__(dataset, batch_size=None, collate_fn=keep_batch, **loader_kwargs)
        self.stream = stream
        self.prefetcher = prefetcher

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # see _BatchLoader
        replay = self.stream.begin_iterator()  # before workers (re)start: they read the cursor
        if self.prefetcher is not None:
            self.prefetcher.clear()  # copies of an earlier iterator's read-ahead: never used
        return _TrackedBatches(self.stream, super().__iter__(), replay, self.prefetcher)

    def state_dict(self) -> dict[str, int]:
        """Nothing: the position is saved once, by the owner of :attr:`stream`."""
        return {}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Nothing to restore: the owner restored the position (a checkpoint written before
        the position was saved once still holds a copy here, equal to the owner's)."""


def check_servable(buffer: BufferHandle, batch_size: int, options: LoaderOptions) -> None:
    """Raise :class:`UsageError` for loader options ``buffer`` cannot be served with.

    Examples:
        >>> from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer
        >>> from rb_lightning.buffers.handles import resolve_buffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=PrioritizedSampler(8, 0.6, 0.4))
        >>> check_servable(resolve_buffer(rb), 4, LoaderOptions(num_workers=2))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rb_lightning.errors.UsageError: num_workers>0 with a PrioritizedSampler: ...
    """
    buffer.check_num_workers(options.num_workers)
    buffer.check_batch_size(batch_size)
    # A lazy storage with device="auto" learns its device at the first write: checked
    # again when the train loader is built.
    check_device_storage(
        buffer.storage_device(),
        num_workers=options.num_workers,
        pin_memory=options.pin_memory,
        prefetch_to_device=options.prefetch_to_device is not False,
    )


__all__ = [
    "LoaderOptions",
    "ResumableBatchLoader",
    "batch_loader",
    "keep_batch",
    "check_servable",
]
