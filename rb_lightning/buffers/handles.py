"""Buffer handles: what kind of buffer a run trains from, decided once.

Each kind of buffer samples, takes priorities, checkpoints and meets DataLoader workers in
its own way. :func:`resolve_buffer` is the one place that looks at the kind and returns a
:class:`BufferHandle`: :class:`LocalBuffer` (a ``ReplayBuffer``), :class:`RankBuffers` (the
same under DDP, a dump per rank), ``RemoteBuffer`` (Ray-served, saved by its actor) or
:class:`MixtureBuffer` (a :class:`BufferMixture`, member by member). A new kind is a new
handle, registered with :func:`~rb_lightning.buffers.registry.register_buffer_kind`.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(8)}, batch_size=[8]))
    >>> handle = resolve_buffer(rb)
    >>> type(handle).__name__, len(handle), handle.describe()
    ('LocalBuffer', 8, 'ReplayBuffer(len=8, storage=LazyTensorStorage, sampler=RandomSampler)')
    >>> type(resolve_buffer(rb, world_size=2)).__name__
    'RankBuffers'
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from typing import Any, ClassVar

import torch
from tensordict import MemoryMappedTensor, TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data import ListStorage, ReplayBuffer, ReplayBufferEnsemble, TensorStorage
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from rb_lightning import torchrl_compat
from rb_lightning.buffers import priorities
from rb_lightning.buffers.mixture import GENERATION_KEY, SOURCE_KEY, BufferMixture
from rb_lightning.buffers.priorities import InvalidPriority, check_priority, current_max_priority
from rb_lightning.buffers.registry import registered_handle
from rb_lightning.buffers.state import (
    buffer_state,
    mixture_state,
    rank_buffer_state,
    restore_buffer_state,
    restore_mixture_state,
)
from rb_lightning.columns import SAMPLER_INFO_KEYS, leaf_keys
from rb_lightning.errors import MissingKeyError, UsageError
from rb_lightning.persist.components import ensure_generator
from rb_lightning.persist.elastic import Redistribution
from rb_lightning.persist.manifest import Verify
from rb_lightning.persist.record import BufferRecord

logger = logging.getLogger(__name__)

__all__ = [
    "BufferHandle",
    "LocalBuffer",
    "MixtureBuffer",
    "RankBuffers",
    "resolve_buffer",
    "storage_device",
]


def resolve_buffer(replay_buffer: ReplayBuffer, *, world_size: int = 1) -> BufferHandle:
    """The handle for ``replay_buffer``: the only function that asks which kind it is.

    Args:
        replay_buffer: A torchrl ``ReplayBuffer``, a buffer of a registered kind
            (a Ray-served one) or a :class:`~rb_lightning.BufferMixture`.
        world_size: Processes training together (DDP): above 1, an in-process
            buffer is one of :class:`RankBuffers`.

    Raises:
        UsageError: A torchrl ``ReplayBufferEnsemble`` that is not a
            ``BufferMixture`` (its nested batches cannot be routed).
    """
    if callable(own := getattr(replay_buffer, "buffer_handle", None)):  # e.g. a sharded one
        return own()
    if (registered := registered_handle(replay_buffer)) is not None:  # a plugin's kind
        return registered
    if isinstance(replay_buffer, BufferMixture):
        return MixtureBuffer(replay_buffer)
    if isinstance(replay_buffer, ReplayBufferEnsemble):
        raise UsageError(
            "replay_buffer",
            "A torchrl ReplayBufferEnsemble samples [k, batch_size / k] batches with a nested "
            "index, which nothing here can route priorities or checkpoints through. Build "
            "the same members as rb_lightning.BufferMixture({'a': rb_a, 'b': rb_b}, "
            "fractions={'a': 0.5, 'b': 0.5}) (or weights=...): flat batches with a 'source' "
            "column, priorities and resume per member.",
        )
    if world_size > 1:
        return RankBuffers(replay_buffer)
    return LocalBuffer(replay_buffer)


def storage_device(replay_buffer: Any) -> torch.device | None:
    """The device a buffer's storage keeps its rows on, or ``None`` while unknown.

    ``None`` for a lazy storage with ``device="auto"`` before its first write, for a
    remote (Ray) buffer, and for a storage without a ``device``.

    Examples:
        >>> from torchrl.data import LazyTensorStorage
        >>> storage_device(ReplayBuffer(storage=LazyTensorStorage(10, device="cpu")))
        device(type='cpu')
    """
    try:
        storage = replay_buffer.storage
    except AttributeError:  # a remote buffer keeps its storage in its actor
        return None
    device = getattr(storage, "device", None)
    if device is None or (isinstance(device, str) and device == "auto"):
        return None
    return torch.device(device)


def _in_shared_memory(storage: TensorStorage) -> bool:
    """Whether a tensor storage's rows live in shared memory or memory-mapped files."""
    rows = torchrl_compat.storage_content(storage)
    if rows is None:  # not initialised: each process would allocate its own rows
        return False
    if isinstance(rows, TensorDictBase):
        return rows.is_shared() or rows.is_memmap()
    return isinstance(rows, MemoryMappedTensor) or (
        isinstance(rows, torch.Tensor) and rows.is_shared()
    )


class BufferHandle:
    """One replay buffer as a training run uses it, whatever serves it.

    Args:
        replay_buffer: The buffer the user gave (the handle adds no state of its own).
    """

    #: Whether this process draws its own samples (``False``: a shared actor
    #: samples for every process, so per-process seeds do not apply).
    samples_in_process: ClassVar[bool] = True

    def __init__(self, replay_buffer: ReplayBuffer) -> None:
        self.replay_buffer = replay_buffer

    def __len__(self) -> int:
        return len(self.replay_buffer)

    def describe(self) -> str:
        """The buffer in one phrase, for logs and error messages."""
        rb = self.replay_buffer
        return (
            f"{type(rb).__name__}(len={len(rb)}, storage={type(rb.storage).__name__}, "
            f"sampler={type(rb.sampler).__name__})"
        )

    def where(self) -> str | None:
        """Where the buffer runs when not in this process (one line for a run's output)."""
        return None

    @property
    def source_names(self) -> list[str] | None:
        """Names of the members behind ``batch["source"]`` ids (``None``: one buffer)."""
        return None

    def in_process_buffers(self) -> list[ReplayBuffer]:
        """The torchrl buffers this process holds and samples (none for a remote one)."""
        return [self.replay_buffer]

    def read(self, start: int, stop: int) -> Any:
        """Stored items ``start:stop`` in storage order (a slice: no copy of string items)."""
        return self.replay_buffer[start:stop]

    def version_tracking_samplers(self) -> list[Any]:
        """Samplers that gate on a stored ``policy_version`` (e.g. torchrl's
        ``StalenessAwareSampler``): they read the learner's version from ``consumer_version``."""
        samplers = [rb.sampler for rb in self.in_process_buffers()]
        return [sampler for sampler in samplers if hasattr(sampler, "consumer_version")]

    def capacity(self) -> int | None:
        """Items the buffer can hold (a mixture: its largest member); ``None``: unknown."""
        sizes = [getattr(rb.storage, "max_size", None) for rb in self.in_process_buffers()]
        known = [int(size) for size in sizes if isinstance(size, int)]
        return max(known) if known else None

    # -- checks and preparation -------------------------------------------------------------
    def check_num_workers(self, num_workers: int) -> None:
        """Raise :class:`UsageError` if ``num_workers`` DataLoader workers cannot sample it."""
        if num_workers == 0:
            return
        rb = self.replay_buffer
        if isinstance(rb.sampler, PrioritizedSampler):
            raise UsageError(
                "num_workers",
                "num_workers>0 with a PrioritizedSampler: each worker samples its own copy of "
                "the sampler, so priority updates made in training_step never reach it. Use "
                "num_workers=0 (sampling in-process is fast; see benchmarks/).",
            )
        spawn = mp.get_start_method(allow_none=True) != "fork"
        if spawn and isinstance(rb.storage, ListStorage):
            raise UsageError(
                "num_workers",
                "num_workers>0 with a ListStorage: spawned worker processes cannot share a "
                "ListStorage. Use LazyTensorStorage (call rb.share() first for live updates) or "
                "LazyMemmapStorage, or num_workers=0.",
            )
        if (
            not spawn
            and isinstance(rb.storage, TensorStorage)
            and not _in_shared_memory(rb.storage)
        ):
            raise UsageError(
                "num_workers",
                "num_workers>0 with the fork start method and a storage outside shared memory: "
                "forked workers keep a copy-on-write snapshot of the rows but share the length "
                "counter, so they would read rows the main process writes later as garbage. "
                "Use the spawn start method (torchrl's default), a LazyMemmapStorage filled "
                "before fit, or num_workers=0.",
            )

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`UsageError` if the buffer cannot be trained from by ``world_size`` ranks."""

    def check_batch_size(self, batch_size: int) -> None:
        """Refuse a prefetching buffer whose own batch size differs from ``batch_size`` (it returns its own size; torchrl only warns)."""
        rb = self.replay_buffer
        own = torchrl_compat.default_batch_size(rb)
        if torchrl_compat.has_prefetch(rb) and own != batch_size:
            raise UsageError(
                "batch_size",
                f"The replay buffer prefetches batches of its own batch_size={own}, but the "
                f"DataModule asks for batch_size={batch_size}; the buffer would silently "
                f"return batches of {own}. Give the buffer batch_size={batch_size} too.",
            )

    def storage_device(self) -> torch.device | None:
        """Where the stored rows live (``None`` while unknown)."""
        return storage_device(self.replay_buffer)

    def stored_keys(self) -> set[NestedKey] | None:
        """The leaf keys of a stored item, plus columns added when sampling; ``None``: unknown yet."""
        rb = self.replay_buffer
        if len(rb) == 0:
            return None
        return set(leaf_keys(rb[torch.zeros(1, dtype=torch.long)]))

    def check_keys(self, keys: list[NestedKey] | None) -> None:
        """Raise :class:`UsageError` if one of ``keys`` is in none of the stored items (quiet while nothing is stored)."""
        stored = None if keys is None else self.stored_keys()
        if stored is None:
            return
        missing = [k for k in keys or () if k not in stored and k not in SAMPLER_INFO_KEYS]
        if missing:
            raise UsageError(
                "keys",
                f"keys={keys!r}: {missing!r} not found in the replay buffer's items, which "
                f"have {sorted(stored, key=str)!r}. Fix the names (nested keys are tuples, "
                "('next', 'reward')) or pass keys=None to keep every key.",
            )

    def prepare(self, num_workers: int) -> None:
        """Make the buffer ready to train from: its own generator (a checkpoint restores it), shared with workers; in ``setup``, as both change the user's buffer."""
        ensure_generator(self.replay_buffer)
        rb = self.replay_buffer
        if num_workers == 0 or not isinstance(rb.storage, TensorStorage) or rb.shared:
            return
        # torchrl publishes a new length before it copies the rows; only the buffer's
        # process-shared write lock (taken by writes and by samples) keeps workers from
        # reading rows that are not written yet, and rb.share() installs that lock.
        rb.share()
        logger.info(
            "ReplayBufferDataModule(num_workers=%d) called rb.share() on the replay buffer: "
            "its write lock is now process-shared, so the %d worker processes never read rows "
            "a write has not finished.",
            num_workers,
            num_workers,
        )

    # -- sampling and writing ---------------------------------------------------------------
    def reseed(self, seed: int) -> None:
        """Sample from now on with a new generator seeded with ``seed``."""
        self.replay_buffer.set_rng(torch.Generator().manual_seed(int(seed)))

    def writer(self, member: str | None = None) -> ReplayBuffer:
        """The buffer a collector extends; ``member`` names one of a mixture's."""
        if member is not None:
            raise UsageError(
                "member",
                f"OnlineCollector(member={member!r}) names a member of a BufferMixture, but "
                f"the replay buffer is a {type(self.replay_buffer).__name__}. Drop member, or "
                "train with a BufferMixture.",
            )
        return self.replay_buffer

    def update_priority(
        self, batch: TensorDictBase, priority: torch.Tensor, *, invalid: InvalidPriority, where: str
    ) -> int:
        """Write ``priority`` for the items of ``batch``; return how many were replaced."""
        rb = self.replay_buffer
        # The sum trees' device (CUDA for a CUDA storage if torchrl has CUDA): one move there.
        tree_device = getattr(getattr(rb, "sampler", None), "device", None)
        tree_device = torch.device(tree_device) if tree_device is not None else torch.device("cpu")
        priority = priorities.in_sampler_dtype(priority, rb.sampler).to(tree_device)
        checked = check_priority(
            priority, invalid=invalid, replacement=lambda: current_max_priority(rb), where=where
        )
        replaced = 0 if checked is priority else int((checked != priority).sum())
        rb.update_priority(batch["index"].to(tree_device), checked)
        return replaced

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self, trainer: Any, *, inline_max_bytes: int, pending_batches: list[Any]) -> Any:
        """The buffer's part of a checkpoint (content, sampler, writer, generator, read-ahead)."""
        return buffer_state(
            self.replay_buffer, inline_max_bytes=inline_max_bytes, pending_batches=pending_batches
        )

    def load_state_dict(
        self,
        record: BufferRecord,
        trainer: Any,
        *,
        verify: Verify,
        redistribution: Redistribution | None = None,
    ) -> list[Any]:
        """Restore :meth:`state_dict`; return the read-ahead batches to hand out first (``redistribution``: deal the items out anew)."""
        return restore_buffer_state(
            self.replay_buffer,
            record,
            trainer.ckpt_path if trainer is not None else None,
            rank=trainer.global_rank if trainer is not None else 0,
            redistribution=redistribution,
            verify=verify,
        )


class LocalBuffer(BufferHandle):
    """A torchrl ``ReplayBuffer`` sampled in this process, the only one training."""


class RankBuffers(BufferHandle):
    """One in-process buffer per DDP rank: each rank samples, and checkpoints, its own."""

    def state_dict(self, trainer: Any, *, inline_max_bytes: int, pending_batches: list[Any]) -> Any:
        """Every rank's buffer, dumped by its rank beside the ``.ckpt`` (collective)."""
        return rank_buffer_state(self.replay_buffer, trainer, pending_batches=pending_batches)


class MixtureBuffer(BufferHandle):
    """A :class:`~rb_lightning.BufferMixture`: several named buffers sampled as one."""

    replay_buffer: BufferMixture

    def describe(self) -> str:
        members = ", ".join(f"{name}={len(rb)}" for name, rb in self.replay_buffer.members.items())
        return f"BufferMixture({members})"

    @property
    def source_names(self) -> list[str] | None:
        return self.replay_buffer.names

    def in_process_buffers(self) -> list[ReplayBuffer]:
        return list(self.replay_buffer.members.values())

    def read(self, start: int, stop: int) -> Any:
        """Items ``start:stop`` of the members in turn, with their ``"source"`` column."""
        return self.replay_buffer.items(start, stop)

    def check_num_workers(self, num_workers: int) -> None:
        if num_workers > 0:
            raise UsageError(
                "num_workers",
                f"ReplayBufferDataModule(num_workers={num_workers}) with a BufferMixture: "
                "each worker would sample its own copy of every member, so the online member's "
                "new items, priority updates and the mixture's exact resume would not reach "
                "them. Use num_workers=0 (in a config: data.init_args.num_workers: 0); a "
                "mixture samples in the training process.",
            )

    def check_world_size(self, world_size: int) -> None:
        if world_size > 1:
            raise UsageError(
                "replay_buffer",
                f"A BufferMixture as replay_buffer with {world_size} processes (DDP): its "
                "checkpoint holds one copy of each member, not one per rank, so a resumed run "
                "could not give each rank its own. Train a mixture in one process "
                "(trainer.devices: 1), or give each rank a single buffer.",
            )

    def stored_keys(self) -> set[NestedKey] | None:
        # Every member holds the same keys: read them from a filled one.
        filled = next((m for m in self.replay_buffer.members.values() if len(m) > 0), None)
        if filled is None:
            return None
        return set(leaf_keys(filled[torch.zeros(1, dtype=torch.long)])) | {SOURCE_KEY}

    def prepare(self, num_workers: int) -> None:
        ensure_generator(self.replay_buffer)  # one generator for every member

    def writer(self, member: str | None = None) -> ReplayBuffer:
        names = self.replay_buffer.names
        if member is None:
            raise UsageError(
                "member",
                f"OnlineCollector writes to one buffer, and the replay buffer is a "
                f"BufferMixture of {names}. Name the member to fill: "
                f"OnlineCollector(member={names[-1]!r}) (in a config: "
                f"init_args.member: {names[-1]}).",
            )
        if member not in names:
            raise UsageError(
                "member",
                f"OnlineCollector(member={member!r}): the mixture has no such member; "
                f"its members are {names}.",
            )
        return self.replay_buffer.member(member)

    def update_priority(
        self, batch: TensorDictBase, priority: torch.Tensor, *, invalid: InvalidPriority, where: str
    ) -> int:
        if SOURCE_KEY not in batch.keys():
            raise MissingKeyError(
                "keys",
                f"The batch has no {SOURCE_KEY!r} key, which routes each item's priority to its "
                f"member of the mixture. Keep it: keys=None or keys including {SOURCE_KEY!r}.",
            )
        mixture = self.replay_buffer
        priority = torch.as_tensor(priority).detach().cpu()
        checked = check_priority(
            priority, invalid=invalid, replacement=mixture.max_priority, where=where
        )
        replaced = 0 if checked is priority else int((checked != priority).sum())
        generation = batch.get(GENERATION_KEY, None)  # slots written since the draw: dropped
        mixture.update_member_priority(
            batch[SOURCE_KEY].cpu(),
            batch["index"].cpu(),
            checked,
            None if generation is None else generation.cpu(),
        )
        return replaced

    def state_dict(self, trainer: Any, *, inline_max_bytes: int, pending_batches: list[Any]) -> Any:
        """Each member saved as one buffer is; the read-ahead batches with the first member."""
        return mixture_state(
            self.replay_buffer, inline_max_bytes=inline_max_bytes, pending_batches=pending_batches
        )

    def load_state_dict(
        self,
        record: BufferRecord,
        trainer: Any,
        *,
        verify: Verify,
        redistribution: Redistribution | None = None,
    ) -> list[Any]:
        """Every member verified before any member is loaded."""
        path = trainer.ckpt_path if trainer is not None else None
        return restore_mixture_state(self.replay_buffer, record, path, verify=verify)
