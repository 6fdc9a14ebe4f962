"""The GPU path: device-resident storages and overlapped host-to-device copies.

A storage on the device (``LazyTensorStorage(N, device="cuda")``) is sampled there and its
batch handed over as it is (:func:`check_device_storage` refuses what cannot work with
it). A host storage with ``prefetch_to_device=True`` gets a :class:`DevicePrefetcher`: when
Lightning reads batch ``n+1`` (before step ``n`` runs) its copy starts through a
:class:`CopyEngine` (on CUDA :class:`CudaStreamCopy`: pinned memory, a side stream and an
event), and ``transfer_batch_to_device`` takes the finished copy. The prefetcher never
samples, so the stream, the priority-update order and the saved read-ahead are unchanged.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> class CopyNow:  # a CopyEngine that copies at once, on the calling thread
    ...     def start(self, batch, device): return batch.clone()
    ...     def finish(self, ticket): return ticket
    >>> prefetcher = DevicePrefetcher(CopyNow(), torch.device("cpu"))
    >>> batch = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    >>> prefetcher.submit(batch)  # when the loader hands the batch out
    >>> on_device = prefetcher.take(batch)  # when Lightning moves it to the device
    >>> on_device["x"].tolist(), on_device is batch, len(prefetcher)
    ([0, 1, 2, 3], False, 0)
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase

from rb_lightning.errors import UsageError

__all__ = [
    "CopyEngine",
    "CudaStreamCopy",
    "DevicePrefetcher",
    "check_device_storage",
    "default_copy_engine",
    "make_prefetcher",
    "move_batch",
]


@runtime_checkable
class CopyEngine(Protocol):
    """Copies a batch to a device in two halves, so other work can run in between.

    ``start`` begins the copy and returns a ticket; ``finish`` takes the ticket and
    returns the device batch, ready for the consumer (on CUDA: the compute stream
    waits for the copy). Implement it for another accelerator's streams.
    """

    def start(self, batch: TensorDictBase, device: torch.device) -> Any:
        """Begin copying ``batch`` to ``device``; return a ticket for :meth:`finish`."""
        ...

    def finish(self, ticket: Any) -> TensorDictBase:
        """Return the device batch of ``ticket``, safe to use on the consumer's stream."""
        ...


def _is_pinned(batch: TensorDictBase) -> bool:
    leaves = batch.values(include_nested=True, leaves_only=True)
    return all(leaf.is_pinned() for leaf in leaves if isinstance(leaf, torch.Tensor))


class CudaStreamCopy:
    """Host-to-CUDA copies on a side stream, from pinned memory.

    ``start`` pins the batch (unless the loader already did, ``pin_memory=True``),
    enqueues a ``non_blocking`` copy on its own stream and records an event; it returns
    without waiting for the copy. ``finish`` makes the current (compute) stream wait
    for that event -- on the GPU, the host does not block -- and tells the caching
    allocator that the compute stream uses the copy (``record_stream``), so its memory
    is not reused while the step's kernels still read it.

    Args:
        device: The CUDA device the copies go to (its side stream is created there).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)

    def start(self, batch: TensorDictBase, device: torch.device) -> Any:
        """Pin, enqueue the copy on the side stream, record its completion event."""
        pinned = batch if _is_pinned(batch) else batch.pin_memory()
        # The side stream must not start before work already queued on the compute
        # stream that produced the host batch's inputs; for host data there is none.
        with torch.cuda.stream(self.stream):
            out = pinned.to(device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        # Keep the pinned source alive until the copy has been waited for.
        return out, done, pinned

    def finish(self, ticket: Any) -> TensorDictBase:
        """Order the compute stream after the copy; return the device batch."""
        out, done, _pinned = ticket
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        out.record_stream(current)
        return out


def default_copy_engine(device: torch.device) -> CopyEngine | None:
    """The engine ``prefetch_to_device=True`` uses for ``device``: CUDA streams, else none.

    ``None`` (no prefetching) for a CPU device: the batch is already in host memory.

    Examples:
        >>> import torch
        >>> default_copy_engine(torch.device("cpu")) is None
        True
    """
    if device.type == "cuda":
        return CudaStreamCopy(device)
    return None


class DevicePrefetcher:
    """Starts each training batch's device copy when the loader hands the batch out.

    :meth:`submit` is called with every batch the training loader yields (Lightning
    reads one ahead, so batch ``n+1`` is submitted before step ``n`` runs); :meth:`take`
    is called from ``transfer_batch_to_device`` and returns the matching device copy,
    or ``None`` for a batch that was never submitted (validation batches, or a batch a
    user hook replaced), which the caller then moves the ordinary way.

    Only weak references to the host batches are kept: a copy whose host batch was
    dropped unused (an epoch cut short) is discarded at the next :meth:`submit`, and
    at most ``max_in_flight`` copies are held.

    Args:
        engine: How copies are made (:class:`CudaStreamCopy`, or any :class:`CopyEngine`).
        device: Where the copies go.

    Keyword Args:
        max_in_flight: Copies kept at most; older ones are dropped.
    """

    def __init__(self, engine: CopyEngine, device: torch.device, *, max_in_flight: int = 4) -> None:
        self.engine = engine
        self.device = torch.device(device)
        self._max_in_flight = max_in_flight
        self._in_flight: deque[tuple[weakref.ref, Any]] = deque()

    def submit(self, batch: Any) -> None:
        """Start copying ``batch`` (a TensorDict; anything else is left to the caller)."""
        if not isinstance(batch, TensorDictBase):
            return
        self._in_flight = deque(entry for entry in self._in_flight if entry[0]() is not None)
        self._in_flight.append((weakref.ref(batch), self.engine.start(batch, self.device)))
        while len(self._in_flight) > self._max_in_flight:
            self._in_flight.popleft()

    def take(self, batch: Any) -> TensorDictBase | None:
        """The finished device copy of ``batch``, or ``None`` if it was not submitted."""
        for position, (host, ticket) in enumerate(self._in_flight):
            if host() is batch:
                del self._in_flight[position]  # by position: tickets hold TensorDicts (no ==)
                return self.engine.finish(ticket)
        return None

    def clear(self) -> None:
        """Drop every copy in flight (a new iterator starts; training ends)."""
        self._in_flight.clear()

    def __len__(self) -> int:
        return len(self._in_flight)


def check_device_storage(
    device: torch.device | None,
    *,
    num_workers: int,
    pin_memory: bool,
    prefetch_to_device: bool,
) -> None:
    """Refuse DataModule arguments that cannot work with a storage on ``device``.

    A storage on an accelerator (any device but the CPU) is sampled where it lives, in
    the training process: worker processes, pinning and device prefetching all assume
    host batches. Raises :class:`~rb_lightning.errors.UsageError` naming the argument.

    Examples:
        >>> import torch
        >>> check_device_storage(torch.device("cpu"), num_workers=2, pin_memory=True,
        ...                      prefetch_to_device=True)
        >>> check_device_storage(torch.device("cuda"), num_workers=0, pin_memory=True,
        ...                      prefetch_to_device=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rb_lightning.errors.UsageError: pin_memory=True with a replay buffer whose storage ...
    """
    if device is None or device.type == "cpu":
        return
    where = f"storage on {device}"
    if num_workers > 0:
        raise UsageError(
            "num_workers",
            f"num_workers={num_workers} with a replay buffer whose {where}: DataLoader worker "
            "processes cannot sample a device storage (each would need its own CUDA context "
            "and a copy of the rows), and sampling on the device is already fast. Use "
            "num_workers=0, or keep the storage in host memory (LazyTensorStorage(N) or "
            "LazyMemmapStorage) to sample in workers.",
        )
    if pin_memory:
        raise UsageError(
            "pin_memory",
            f"pin_memory=True with a replay buffer whose {where}: batches are sampled on the "
            "device, so there is no host memory to pin (pinning would copy every batch to the "
            "host and back). Use pin_memory=False; the batches reach the step without a copy.",
        )
    if prefetch_to_device:
        raise UsageError(
            "prefetch_to_device",
            f"prefetch_to_device with a replay buffer whose {where}: the batches are already "
            "on the device, so there is no host-to-device copy to overlap. Use "
            "prefetch_to_device=False, or keep the storage in host memory "
            "(LazyTensorStorage(N)) to overlap its copies with the step.",
        )


def make_prefetcher(
    prefetch_to_device: bool | CopyEngine, device: torch.device
) -> DevicePrefetcher | None:
    """The prefetcher a ``prefetch_to_device`` argument asks for on ``device`` (``None``: none).

    ``True`` picks :func:`default_copy_engine` (nothing on the CPU, where the batch
    already is); a :class:`CopyEngine` is used as given.

    Examples:
        >>> import torch
        >>> make_prefetcher(True, torch.device("cpu")) is None
        True
        >>> class CopyNow:
        ...     def start(self, batch, device): return batch.clone()
        ...     def finish(self, ticket): return ticket
        >>> type(make_prefetcher(CopyNow(), torch.device("cpu"))).__name__
        'DevicePrefetcher'
    """
    if prefetch_to_device is False:
        return None
    engine = default_copy_engine(device) if prefetch_to_device is True else prefetch_to_device
    return None if engine is None else DevicePrefetcher(engine, device)


def move_batch(
    batch: TensorDictBase,
    device: torch.device,
    prefetcher: DevicePrefetcher | None,
    *,
    pin_memory: bool,
) -> TensorDictBase:
    """``batch`` on ``device``: the copy a prefetcher started, the batch itself, or a new copy.

    A batch already on ``device`` (a storage on the GPU) is returned without a
    copy (``TensorDict.to`` would rebuild it); pinned host batches are copied
    with ``non_blocking=True`` to CUDA.
    """
    prefetched = prefetcher.take(batch) if prefetcher is not None else None
    if prefetched is not None:
        return prefetched
    if batch.device == device:
        return batch
    return batch.to(device, non_blocking=pin_memory and device.type == "cuda")
