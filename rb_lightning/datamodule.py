"""``ReplayBufferDataModule``: a torchrl replay buffer as a LightningDataModule."""

from __future__ import annotations

import logging
import math
from typing import Any, Final, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities.model_helpers import is_overridden
from tensordict import MemoryMappedTensor, TensorDictBase
from tensordict.utils import NestedKey
from torch.utils.data import DataLoader
from torchrl.data import ListStorage, ReplayBuffer, ReplayBufferEnsemble, TensorStorage
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from rb_lightning import torchrl_compat
from rb_lightning.checkpoint import (
    DEFAULT_INLINE_MAX_BYTES,
    Verify,
    buffer_state,
    check_verify_mode,
    ensure_generator,
    install_checkpoint_io,
    mixture_state,
    rank_buffer_state,
    remote_buffer_state,
    restore_buffer_state,
    restore_mixture_state,
    restore_remote_buffer_state,
)
from rb_lightning.columns import leaf_keys
from rb_lightning.errors import UsageError
from rb_lightning.sources.buffer_sources import BufferSource, SourceError
from rb_lightning.sources.mixture import SOURCE_KEY, BufferMixture
from rb_lightning.stream.datasets import ReplayBufferBatchDataset, ReplayBufferPassDataset
from rb_lightning.stream.device_prefetch import (
    CopyEngine,
    DevicePrefetcher,
    check_device_storage,
    default_copy_engine,
    storage_device,
)
from rb_lightning.stream.loader import ResumableBatchLoader, batch_loader
from rb_lightning.stream.priorities import (
    InvalidPriority,
    check_invalid_priority_mode,
    check_priority,
    current_max_priority,
)
from rb_lightning.stream.sampling import SAMPLER_INFO_KEYS, BufferStream
from rb_lightning.stream.sharding import is_remote
from rb_lightning.stream.state import StreamState
from rb_lightning.validation import (
    check_keys,
    check_non_negative_int,
    check_positive_int,
    check_replay_buffer,
)

AUTO: Final = "auto"
# Which sources each Lightning stage reads from.
_SOURCES_FOR_STAGE = {
    "fit": ("source", "val_source"),
    "validate": ("val_source",),
    "test": ("test_source",),
}

logger = logging.getLogger(__name__)


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


def _part_name(rb: ReplayBuffer, part: str) -> str:
    # A Ray-backed buffer keeps its storage and sampler in the actor.
    try:
        return type(getattr(rb, part)).__name__
    except AttributeError:
        return "<remote>"


def _check_source(
    source: Any, name: str, buffer: ReplayBuffer | None, buffer_name: str
) -> BufferSource | None:
    if source is None:
        return None
    if not isinstance(source, BufferSource):
        raise TypeError(
            f"{name} must be a rb_lightning.sources.BufferSource (LoadDirectory, CallSource), "
            f"got {type(source).__name__}."
        )
    if buffer is None:
        raise ValueError(f"{name} fills {buffer_name}, but no {buffer_name} was given.")
    return source


class ReplayBufferDataModule(LightningDataModule):
    """Serve a torchrl ``ReplayBuffer`` to ``Trainer.fit`` as whole sampled batches.

    Each training batch is one ``rb.sample(batch_size)`` call, delivered as a
    ``TensorDict`` where the storage keeps its rows; Lightning moves it to the
    accelerator through :meth:`transfer_batch_to_device` (``non_blocking`` when
    memory is pinned). A storage on the GPU (``LazyTensorStorage(N,
    device="cuda")``) is sampled there and its batches are handed over without a
    copy; a host storage can overlap each copy with the previous step
    (``prefetch_to_device=True``). See docs/datasets.md, "GPU".

    Args:
        replay_buffer: The buffer to sample training batches from; a
            :class:`~rb_lightning.BufferMixture` samples several named buffers as
            one, each batch with a per-item ``"source"`` id (:attr:`source_names`).
        batch_size: Items per training batch.

    Keyword Args:
        keys: Keys to keep in each batch (nested keys as tuples); ``None`` keeps all.
        num_batches: Training batches per epoch. ``"auto"`` (default): one
            buffer's worth, ``ceil(len(buffer) / batch_size)`` measured when the
            train dataloader is built (a mixture: all members' items together). An int: that many. ``None``: an unbounded
            online stream; the Trainer must then bound it with
            ``limit_train_batches=<int>`` (every epoch is that many batches) or
            ``max_steps``, else :meth:`train_dataloader` raises.
        num_workers: DataLoader worker processes. ``0`` (default) samples in
            the training process, which is fastest on few cores and the only
            option that sees priority updates. With workers, a tensor-storage
            buffer is made process-shared (``rb.share()``, said in the log).
        pin_memory: Pin batches so host-to-GPU copies can be asynchronous.
            Refused for a storage on the GPU (nothing on the host to pin).
        prefetch_to_device: Overlap the host-to-device copy of batch ``n+1`` with
            step ``n`` (host storages on CUDA): when Lightning reads a batch ahead,
            its copy starts at once on a side CUDA stream from pinned memory, and
            the step's stream waits for it on the GPU, not on the host. Batches
            are sampled exactly when they would be without it, so the stream and
            exact resume are unchanged. ``True`` uses
            :class:`~rb_lightning.stream.device_prefetch.CudaStreamCopy` on a CUDA device
            and does nothing on CPU; a
            :class:`~rb_lightning.stream.device_prefetch.CopyEngine` instance is used on
            any device (e.g. :class:`~rb_lightning.stream.device_prefetch.SyncCopy`).
            Default ``False``: its gain on a GPU has not been measured yet
            (``benchmarks/gpu_path.py``). Refused for a storage on the GPU.
        persistent_workers: Keep workers alive across epochs.
        val_buffer: Optional buffer read once per validation run, in storage order.
        test_buffer: Optional buffer read once per test run, in storage order.
        min_size: Wait until the training buffer holds this many items before
            the first sample (for a collector filling it concurrently).
        wait_timeout: Seconds to wait for ``min_size`` before raising.
        source: Optional :class:`~rb_lightning.sources.BufferSource` that fills
            the training buffer once, in :meth:`setup` (a directory saved with
            ``rb.dumps``, or a ``"module:function"``).
        val_source: Same, for ``val_buffer``.
        test_source: Same, for ``test_buffer``.
        checkpoint_inline_max_bytes: Checkpoints carry the training buffer
            (content, sampler, writer, generator). Buffers whose storage holds
            at most this many bytes (default 64 MiB) go inside the ``.ckpt``;
            larger ones are written beside it, in ``<ckpt>.buffer/``. ``0``:
            always beside. See README "Resume".
        checkpoint_verify: What a resume checks in the saved buffer before
            loading it. ``"full"`` (default): the size and the ``xxh3_64``
            checksum of every file, so a flipped byte stops the resume with a
            :class:`~rb_lightning.checkpoint.BufferCheckpointError` naming the
            file and column. ``"size"``: file sizes only (for multi-GB buffers
            on disks you trust: no read of the data before loading it).
            ``"none"``: nothing but a readable manifest. Checksums are written
            with every checkpoint whatever this says (docs/checkpoints.md).
        invalid_priority: What :meth:`update_priority` does with NaN, infinite
            or negative priorities (one of them poisons a ``PrioritizedSampler``
            for good). ``"raise"`` (default): raise
            :class:`~rb_lightning.stream.priorities.InvalidPriorityError` counting them.
            ``"replace"``: replace them with the sampler's current max priority
            (``1.0`` if unknown), log a warning with the count and keep
            training; :attr:`replaced_priorities` counts them over the run.
        eval_from_model: ``validate``/``test`` (and validation during fit)
            without a ``val_buffer``/``test_buffer`` read the LightningModule's
            own ``val_dataloader()``/``test_dataloader()``, e.g. the greedy
            evaluation episodes of :class:`rb_lightning.rl.DQN` and ``SAC``.
            Lightning otherwise ignores the model's loaders once a DataModule
            is attached.

    Examples:
        >>> import torch
        >>> import lightning as L
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from rb_lightning import ReplayBufferDataModule
        >>>
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
        >>> x = torch.randn(1_000, 4)
        >>> _ = rb.extend(TensorDict({"x": x, "y": x.sum(-1, keepdim=True)}, batch_size=[1_000]))
        >>>
        >>> class Regressor(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>>
        >>> trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
        ...                     enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(Regressor(), datamodule=ReplayBufferDataModule(rb, batch_size=100))
        >>> trainer.global_step  # 2 epochs x ceil(1000 / 100) batches
        20
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int = 256,
        *,
        keys: list[NestedKey] | None = None,
        num_batches: int | Literal["auto"] | None = AUTO,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_to_device: bool | CopyEngine = False,
        val_buffer: ReplayBuffer | None = None,
        test_buffer: ReplayBuffer | None = None,
        min_size: int | None = None,
        wait_timeout: float = 600.0,
        source: BufferSource | None = None,
        val_source: BufferSource | None = None,
        test_source: BufferSource | None = None,
        checkpoint_inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
        checkpoint_verify: Verify = "full",
        eval_from_model: bool = False,
        invalid_priority: InvalidPriority = "raise",
    ) -> None:
        super().__init__()
        self.replay_buffer = check_replay_buffer(replay_buffer)
        if isinstance(replay_buffer, ReplayBufferEnsemble) and not isinstance(
            replay_buffer, BufferMixture
        ):
            raise UsageError(
                "replay_buffer",
                "A torchrl ReplayBufferEnsemble samples [k, batch_size / k] batches with a nested "
                "index, which nothing here can route priorities or checkpoints through. Build "
                "the same members as rb_lightning.BufferMixture({'a': rb_a, 'b': rb_b}, "
                "fractions={'a': 0.5, 'b': 0.5}) (or weights=...): flat batches with a 'source' "
                "column, priorities and resume per member.",
            )
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.keys = check_keys(keys)
        if not (isinstance(num_batches, str) and num_batches == AUTO):
            num_batches = check_positive_int(num_batches, "num_batches", allow_none=True)
        self.num_batches = num_batches
        self.num_workers = check_non_negative_int(num_workers, "num_workers")
        self.pin_memory = bool(pin_memory)
        if persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers=True needs num_workers > 0.")
        self.persistent_workers = bool(persistent_workers)
        if not isinstance(prefetch_to_device, (bool, CopyEngine)):
            raise TypeError(
                "prefetch_to_device must be True, False or a rb_lightning.stream.device_prefetch."
                f"CopyEngine, got {type(prefetch_to_device).__name__}."
            )
        self.prefetch_to_device = prefetch_to_device
        # The copies in flight of the current training loader (built in train_dataloader).
        self._prefetcher: DevicePrefetcher | None = None
        self.val_buffer = (
            None if val_buffer is None else check_replay_buffer(val_buffer, "val_buffer")
        )
        self.test_buffer = (
            None if test_buffer is None else check_replay_buffer(test_buffer, "test_buffer")
        )
        self.min_size = check_positive_int(min_size, "min_size", allow_none=True)
        self.wait_timeout = wait_timeout
        self.source, self.val_source, self.test_source = source, val_source, test_source
        self._unfilled: list[tuple[str, BufferSource, ReplayBuffer]] = []
        for name, src, buffer, buffer_name in (
            ("source", source, self.replay_buffer, "replay_buffer"),
            ("val_source", val_source, self.val_buffer, "val_buffer"),
            ("test_source", test_source, self.test_buffer, "test_buffer"),
        ):
            checked = _check_source(src, name, buffer, buffer_name)
            if checked is not None and buffer is not None:  # a source without a buffer raised
                self._unfilled.append((name, checked, buffer))
        self._check_storage_device()
        self._check_workers_fit_buffer()
        self._share_buffer_with_workers()
        self._check_prefetch_batch_size()
        # Lightning runs a loop when the hook is overridden, so only bind the
        # val/test hooks, on this instance, when there is data behind them.
        self.eval_from_model = bool(eval_from_model)
        hooks = vars(self)
        if self.val_buffer is not None or self.eval_from_model:
            hooks["val_dataloader"] = self._val_dataloader
        if self.test_buffer is not None or self.eval_from_model:
            hooks["test_dataloader"] = self._test_dataloader
        # The training stream's position: taken batches, read-ahead, epoch and seed. The
        # train loader reports it to Lightning's checkpoints; no batch hook touches it.
        self._stream = StreamState(
            torch.initial_seed(),
            progress=self._loop_progress,
            keep_read_ahead=self.num_workers == 0,
        )
        self.checkpoint_inline_max_bytes = check_non_negative_int(
            checkpoint_inline_max_bytes, "checkpoint_inline_max_bytes"
        )
        self.checkpoint_verify = check_verify_mode(checkpoint_verify, "checkpoint_verify")
        self.invalid_priority = check_invalid_priority_mode(invalid_priority)
        #: NaN, infinite or negative priorities replaced so far (``invalid_priority="replace"``).
        self.replaced_priorities = 0
        # Sampling must draw from a generator a checkpoint can restore, not the global RNG.
        # A remote buffer's generator lives in its actor, with its owner.
        if not is_remote(self.replay_buffer):
            ensure_generator(self.replay_buffer)

    @property
    def source_names(self) -> list[str] | None:
        """Names of a :class:`~rb_lightning.BufferMixture`'s members, by source id (``None``: one buffer).

        ``batch["source"]`` holds each item's source id: ``source_names[batch["source"][i]]``.
        """
        rb = self.replay_buffer
        return rb.names if isinstance(rb, BufferMixture) else None

    # -- checks -----------------------------------------------------------------------------
    def _check_storage_device(self) -> None:
        # A lazy storage with device="auto" learns its device at the first write: checked
        # again when the train loader is built.
        check_device_storage(
            storage_device(self.replay_buffer),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            prefetch_to_device=self.prefetch_to_device is not False,
        )

    def _check_workers_fit_buffer(self) -> None:
        if self.num_workers == 0:
            return
        rb = self.replay_buffer
        if isinstance(rb, BufferMixture):
            raise UsageError(
                "num_workers",
                f"ReplayBufferDataModule(num_workers={self.num_workers}) with a BufferMixture: "
                "each worker would sample its own copy of every member, so the online member's "
                "new items, priority updates and the mixture's exact resume would not reach "
                "them. Use num_workers=0 (in a config: data.init_args.num_workers: 0); a "
                "mixture samples in the training process.",
            )
        if is_remote(rb):
            raise ValueError(
                f"num_workers>0 with a {rb.service_backend}-backed replay buffer: it samples in "
                "its own actor, so worker processes add nothing but another connection. Use "
                "num_workers=0."
            )
        if isinstance(rb.sampler, PrioritizedSampler):
            raise ValueError(
                "num_workers>0 with a PrioritizedSampler: each worker samples its own copy of "
                "the sampler, so priority updates made in training_step never reach it. Use "
                "num_workers=0 (sampling in-process is fast; see benchmarks/)."
            )
        spawn = mp.get_start_method(allow_none=True) != "fork"
        if spawn and isinstance(self.replay_buffer.storage, ListStorage):
            raise ValueError(
                "num_workers>0 with a ListStorage: spawned worker processes cannot share a "
                "ListStorage. Use LazyTensorStorage (call rb.share() first for live updates) or "
                "LazyMemmapStorage, or num_workers=0."
            )
        if (
            not spawn
            and isinstance(rb.storage, TensorStorage)
            and not _in_shared_memory(rb.storage)
        ):
            raise ValueError(
                "num_workers>0 with the fork start method and a storage outside shared memory: "
                "forked workers keep a copy-on-write snapshot of the rows but share the length "
                "counter, so they would read rows the main process writes later as garbage. "
                "Use the spawn start method (torchrl's default), a LazyMemmapStorage filled "
                "before fit, or num_workers=0."
            )

    def _share_buffer_with_workers(self) -> None:
        """``rb.share()`` a tensor-storage buffer that worker processes will sample.

        torchrl publishes a new length before it copies the rows; only the buffer's
        process-shared write lock (taken by writes and by samples) keeps workers from
        reading rows that are not written yet, and ``rb.share()`` installs that lock.
        It changes the user's buffer, so it is said, once, in the log.
        """
        rb = self.replay_buffer
        if self.num_workers == 0 or not isinstance(rb.storage, TensorStorage) or rb.shared:
            return
        rb.share()
        logger.info(
            "ReplayBufferDataModule(num_workers=%d) called rb.share() on the replay buffer: "
            "its write lock is now process-shared, so the %d worker processes never read rows "
            "a write has not finished.",
            self.num_workers,
            self.num_workers,
        )

    def _check_prefetch_batch_size(self) -> None:
        # A prefetching buffer samples ahead with its own batch_size and returns those
        # batches whatever size sample() asks for (torchrl only warns).
        rb = self.replay_buffer
        own = torchrl_compat.default_batch_size(rb)
        if getattr(rb, "_prefetch", False) and own != self.batch_size:
            raise ValueError(
                f"The replay buffer prefetches batches of its own batch_size={own}, but the "
                f"DataModule asks for batch_size={self.batch_size}; the buffer would silently "
                f"return batches of {own}. Give the buffer batch_size={self.batch_size} too."
            )

    def _resolve_num_batches(self) -> int | None:
        if not isinstance(self.num_batches, str):  # an int or None, not "auto"
            return self.num_batches
        size = len(self.replay_buffer)
        if size == 0:
            raise RuntimeError(
                "num_batches='auto' sizes an epoch from the buffer, but the replay buffer is "
                "empty. Fill it before fit, or, for a buffer that a collector fills during fit, "
                "pass num_batches=None and bound the epoch with Trainer(limit_train_batches=N)."
            )
        count = math.ceil(size / self.batch_size)
        if dist.is_available() and dist.is_initialized():
            # Ranks with different local buffer sizes must still agree on the epoch
            # length, or the longest rank waits forever in its last gradient sync.
            total = torch.tensor([count])
            dist.all_reduce(total, op=dist.ReduceOp.MIN)
            count = int(total.item())
        return count

    def _check_epoch_is_bounded(self, num_batches: int | None) -> None:
        trainer = self.trainer
        if num_batches is not None or trainer is None:
            return
        limit = trainer.limit_train_batches
        bounded_by_limit = isinstance(limit, int) and not isinstance(limit, bool)
        bounded_by_steps = trainer.max_steps is not None and trainer.max_steps >= 0
        if not (bounded_by_limit or bounded_by_steps):
            raise UsageError(
                "num_batches",
                "ReplayBufferDataModule(num_batches=None) is an unbounded stream, and this "
                f"Trainer has no bound for it (limit_train_batches={limit!r}, "
                f"max_steps={trainer.max_steps}): the first epoch would never end. Set "
                "Trainer(limit_train_batches=<int>) to make every epoch that many batches, "
                "or Trainer(max_steps=<int>), or give the DataModule num_batches=<int> (in a "
                "config: trainer.limit_train_batches, trainer.max_steps, "
                "data.init_args.num_batches).",
            )

    # -- data -------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Fill the buffers this stage reads from their sources, each buffer once.

        ``fit`` fills ``replay_buffer`` and ``val_buffer``, ``validate`` the
        ``val_buffer`` and ``test`` the ``test_buffer``.
        """
        wanted = _SOURCES_FOR_STAGE.get(stage, ())
        for entry in [entry for entry in self._unfilled if entry[0] in wanted]:
            name, source, buffer = entry
            try:
                source.fill(buffer)
            except SourceError as err:
                if err.argument == name:
                    raise
                raise SourceError(str(err), argument=name) from err
            self._unfilled.remove(entry)
        if stage == "fit":
            self._check_mixture_fits_trainer()
            self._check_keys_exist()
            if self.num_batches is None:
                self._check_epoch_is_bounded(None)  # before Lightning prints or builds anything

    def _check_mixture_fits_trainer(self) -> None:
        trainer = self.trainer
        if isinstance(self.replay_buffer, BufferMixture) and trainer is not None:
            if trainer.world_size > 1:
                raise UsageError(
                    "replay_buffer",
                    f"A BufferMixture as replay_buffer with {trainer.world_size} processes "
                    "(DDP): its checkpoint holds one copy of each member, not one per rank, so "
                    "a resumed run could not give each rank its own. Train a mixture in one "
                    "process (trainer.devices: 1), or give each rank a single buffer.",
                )

    def _check_keys_exist(self) -> None:
        """Fail at setup when a requested key is in none of the stored items."""
        rb = self.replay_buffer
        if isinstance(rb, BufferMixture):  # the keys of a filled member (all hold the same)
            rb = next((m for m in rb.members.values() if len(m) > 0), rb)
        if self.keys is None or is_remote(rb) or len(rb) == 0 or isinstance(rb, BufferMixture):
            return  # nothing stored yet (a collector will fill it): checked at first sample
        stored = set(leaf_keys(rb[torch.zeros(1, dtype=torch.long)]))
        missing = [
            k
            for k in self.keys
            if k not in stored and k not in SAMPLER_INFO_KEYS and k != SOURCE_KEY
        ]
        if missing:
            raise ValueError(
                f"keys={self.keys!r}: {missing!r} not found in the replay buffer's items, which "
                f"have {sorted(stored, key=str)!r}. Fix the names (nested keys are tuples, "
                "('next', 'reward')) or pass keys=None to keep every key."
            )

    # -- dataloaders ------------------------------------------------------------------------
    def _loader(self, dataset: Any) -> DataLoader:
        return batch_loader(
            dataset,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        """Sampled batches of the training buffer."""
        num_batches = self._resolve_num_batches()
        self._check_epoch_is_bounded(num_batches)
        self._check_storage_device()
        dataset = ReplayBufferBatchDataset(
            self.replay_buffer,
            self.batch_size,
            keys=self.keys,
            num_batches=num_batches,
            min_size=self.min_size,
            wait_timeout=self.wait_timeout,
            cursor=self._stream.cursor,
        )
        self._prefetcher = self._make_prefetcher()
        return ResumableBatchLoader(
            dataset,
            self._stream,
            prefetcher=self._prefetcher,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
        )

    def _make_prefetcher(self) -> DevicePrefetcher | None:
        trainer = self.trainer
        if self.prefetch_to_device is False or trainer is None:
            return None
        device = trainer.strategy.root_device
        if self.prefetch_to_device is True:
            engine = default_copy_engine(device)  # None on CPU: the batch is already there
        else:
            engine = self.prefetch_to_device
        return None if engine is None else DevicePrefetcher(engine, device)

    def _val_dataloader(self) -> Any:
        """One in-order pass over ``val_buffer``, else the model's own ``val_dataloader()``."""
        if self.val_buffer is None:
            return self._model_dataloader("val_dataloader", "val_buffer")
        return self._loader(
            ReplayBufferPassDataset(self.val_buffer, self.batch_size, keys=self.keys)
        )

    def _test_dataloader(self) -> Any:
        """One in-order pass over ``test_buffer``, else the model's own ``test_dataloader()``."""
        if self.test_buffer is None:
            return self._model_dataloader("test_dataloader", "test_buffer")
        return self._loader(
            ReplayBufferPassDataset(self.test_buffer, self.batch_size, keys=self.keys)
        )

    def _model_dataloader(self, hook: str, buffer_argument: str) -> Any:
        # eval_from_model: Lightning reads every loader from the DataModule once one is
        # attached, so the DataModule hands over the model's own (e.g. RL evaluation episodes).
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is None or not is_overridden(hook, module):
            raise UsageError(
                "eval_from_model",
                f"ReplayBufferDataModule(eval_from_model=True) hands {hook}() over to the "
                f"LightningModule, but {type(module).__name__} does not define {hook}(). "
                f"Give the DataModule a {buffer_argument} (and a source to fill it) instead, or "
                "use a module that evaluates itself (rb_lightning.rl.DQN / SAC).",
            )
        return getattr(module, hook)()

    # -- batch transfer ---------------------------------------------------------------------
    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        """Move a TensorDict batch in one call; anything else goes to Lightning's default.

        A batch already on ``device`` (a storage on the GPU) is returned as it is; a batch
        whose copy :attr:`prefetch_to_device` started is returned as that copy.
        """
        if isinstance(batch, TensorDictBase):
            prefetched = self._prefetcher.take(batch) if self._prefetcher is not None else None
            if prefetched is not None:
                return prefetched
            if batch.device == device:
                return batch  # sampled on the device: no copy (TensorDict.to would rebuild it)
            non_blocking = self.pin_memory and device.type == "cuda"
            return batch.to(device, non_blocking=non_blocking)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # -- priorities -------------------------------------------------------------------------
    def update_priority(self, batch: TensorDictBase, priority: torch.Tensor) -> None:
        """Write new priorities for the items of ``batch`` (e.g. ``|td_error|``).

        Call it from ``training_step``:
        ``self.trainer.datamodule.update_priority(batch, td_error.abs())``.
        NaN, infinite and negative priorities raise
        :class:`~rb_lightning.stream.priorities.InvalidPriorityError`, or are replaced
        with the current max priority when ``invalid_priority="replace"``.
        """
        if "index" not in batch.keys():
            raise KeyError(
                "The batch has no 'index' key. Priority updates need a buffer whose sampler "
                "returns weights (PrioritizedSampler) and keys=None or keys including 'index'."
            )
        rb = self.replay_buffer
        if isinstance(rb, BufferMixture):
            self._update_mixture_priority(rb, batch, priority)
            return
        # Where the sampler keeps its priorities: torchrl's PrioritizedSampler reports its
        # segment trees' device (CUDA trees for a CUDA storage, when torchrl was built with
        # CUDA; else CPU). Moving there once avoids a round trip through the other device.
        tree_device = getattr(getattr(rb, "sampler", None), "device", None)
        tree_device = torch.device(tree_device) if tree_device is not None else torch.device("cpu")
        priority = torch.as_tensor(priority).detach().to(tree_device)
        checked = check_priority(
            priority,
            invalid=self.invalid_priority,
            replacement=lambda: current_max_priority(rb),
            where="ReplayBufferDataModule.update_priority",
        )
        if checked is not priority:
            self.replaced_priorities += int((checked != priority).sum())
        rb.update_priority(batch["index"].to(tree_device), checked)

    def _update_mixture_priority(
        self, mixture: BufferMixture, batch: TensorDictBase, priority: torch.Tensor
    ) -> None:
        if SOURCE_KEY not in batch.keys():
            raise KeyError(
                f"The batch has no {SOURCE_KEY!r} key, which routes each item's priority to its "
                f"member of the mixture. Keep it: keys=None or keys including {SOURCE_KEY!r}."
            )
        priority = torch.as_tensor(priority).detach().cpu()
        checked = check_priority(
            priority,
            invalid=self.invalid_priority,
            replacement=mixture.max_priority,
            where="ReplayBufferDataModule.update_priority",
        )
        if checked is not priority:
            self.replaced_priorities += int((checked != priority).sum())
        mixture.update_member_priority(batch[SOURCE_KEY].cpu(), batch["index"].cpu(), checked)

    def teardown(self, stage: str) -> None:
        """Drop the device copies still in flight (``prefetch_to_device``) when fit ends."""
        if self._prefetcher is not None:
            self._prefetcher.clear()

    # -- export -----------------------------------------------------------------------------
    def as_hf_dataset(self, **options: Any) -> Any:
        """The training stream as a Hugging Face dataset, for TRL (needs the ``hf`` extra).

        Samples :attr:`replay_buffer` with this module's ``batch_size``, ``keys``,
        ``min_size`` and ``wait_timeout``; ``num_batches="auto"`` becomes one
        pass over the buffer's current size. ``options`` go to
        :func:`rb_lightning.hf.to_hf_dataset` and override them.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> from rb_lightning import ReplayBufferDataModule
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
            >>> _ = rb.extend(TensorDict({"x": torch.arange(8)}, batch_size=[8]))
            >>> ds = ReplayBufferDataModule(rb, batch_size=4).as_hf_dataset()
            >>> len(list(ds))  # "auto": 8 items / 4 per batch = 2 batches
            8
        """
        from rb_lightning.hf.export import to_hf_dataset  # imports `datasets`: only when asked

        num_batches = self.num_batches
        if num_batches == AUTO:
            num_batches = max(1, math.ceil(len(self.replay_buffer) / self.batch_size))
        stream = BufferStream(
            self.replay_buffer,
            self.batch_size,
            min_size=self.min_size,
            wait_timeout=self.wait_timeout,
        )
        options = {"num_batches": num_batches, **options}
        if options.get("keys") is None:
            options["keys"] = self.keys
        return to_hf_dataset(stream, **options)

    # -- state ------------------------------------------------------------------------------
    @property
    def batches_served(self) -> int:
        """Training batches the training loop has taken, counted across resumed runs."""
        return self._stream.batches_served

    def _loop_progress(self) -> tuple[int, bool] | None:
        """Batches of the current epoch the fit loop has taken, and whether the epoch is done.

        Read from Lightning's own progress counters (not from a batch hook, which a
        subclass may override): ``ready`` counts the batches moved to the device.
        """
        trainer = self.trainer
        if trainer is None:
            return None
        ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        return ready, ready >= trainer.num_training_batches

    def state_dict(self) -> dict[str, Any]:
        """What Lightning stores in checkpoints for this DataModule.

        The training buffer (content, writer cursor and ``write_count``, sampler
        state, sampling generator), the stream position (also saved by Lightning
        as the train loader's state), and the batches Lightning read ahead of the
        saved step. Small buffers are packed into the ``.ckpt``; larger ones
        (``checkpoint_inline_max_bytes``) are written beside it by
        :class:`~rb_lightning.checkpoint.BufferCheckpointIO`, which this installs
        on the Trainer. Under DDP every rank's buffer is written beside it, one
        directory per rank (all ranks call this: Lightning's ``save_checkpoint``
        runs on every rank). A Ray buffer (``service_backend="ray"``,
        :class:`~rb_lightning.ray.RayReplayBufferView`) is written beside it by its
        actor, once per checkpoint, on behalf of global rank 0.
        """
        stream = self._stream.state_dict()
        trainer = self.trainer
        buffer: Any
        if is_remote(self.replay_buffer):
            # One actor serves every rank: global rank 0 has it dump itself beside the .ckpt
            # (one writer per checkpoint); the other ranks store only their stream position.
            buffer = remote_buffer_state(self.replay_buffer, trainer)
            return {"batches_served": stream["batches_served"], "stream": stream, "buffer": buffer}
        install_checkpoint_io(trainer)
        if isinstance(self.replay_buffer, BufferMixture):
            buffer = mixture_state(
                self.replay_buffer,
                inline_max_bytes=self.checkpoint_inline_max_bytes,
                pending_batches=self._stream.read_ahead(),
            )
        elif trainer is not None and trainer.world_size > 1:
            # One buffer per rank, each saved by its rank and restored to it (collective).
            buffer = rank_buffer_state(
                self.replay_buffer, trainer, pending_batches=self._stream.read_ahead()
            )
        else:
            buffer = buffer_state(
                self.replay_buffer,
                inline_max_bytes=self.checkpoint_inline_max_bytes,
                pending_batches=self._stream.read_ahead(),
            )
        return {"batches_served": stream["batches_served"], "stream": stream, "buffer": buffer}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`: the buffer is replaced by the saved one.

        Raises :class:`~rb_lightning.checkpoint.BufferCheckpointError` naming the
        path when a buffer saved beside the checkpoint is missing or damaged.
        """
        stream = state_dict.get("stream")
        if stream is None:  # a checkpoint of rb_lightning before the stream state
            served = int(state_dict.get("batches_served", 0))
            stream = {"seed": torch.initial_seed(), "epoch": 0, "position": 0}
            stream["batches_served"] = served
        self._stream.load_state_dict(stream)
        buffer = state_dict.get("buffer")
        trainer = self.trainer
        if buffer is not None and is_remote(self.replay_buffer):
            # Rank 0 loads the actor; every rank waits for it before sampling (collective).
            install_checkpoint_io(trainer)
            path = trainer.ckpt_path if trainer is not None else None
            restore_remote_buffer_state(
                self.replay_buffer, buffer, path, trainer, verify=self.checkpoint_verify
            )
        elif buffer is not None and isinstance(self.replay_buffer, BufferMixture):
            install_checkpoint_io(trainer)
            path = trainer.ckpt_path if trainer is not None else None
            self._stream.replay_first(
                restore_mixture_state(
                    self.replay_buffer, buffer, path, verify=self.checkpoint_verify
                )
            )
        elif buffer is not None:
            install_checkpoint_io(trainer)
            restored = restore_buffer_state(
                self.replay_buffer,
                buffer,
                trainer.ckpt_path if trainer is not None else None,
                rank=trainer.global_rank if trainer is not None else 0,
                world_size=trainer.world_size if trainer is not None else 1,
                verify=self.checkpoint_verify,
            )
            self._stream.replay_first(restored)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={type(self.replay_buffer).__name__}"
            f"(len={len(self.replay_buffer)}, storage={_part_name(self.replay_buffer, 'storage')}, "
            f"sampler={_part_name(self.replay_buffer, 'sampler')}), batch_size={self.batch_size}, "
            f"num_batches={self.num_batches!r}, num_workers={self.num_workers}, "
            f"pin_memory={self.pin_memory}, prefetch_to_device={self.prefetch_to_device!r})"
        )


__all__ = [
    "ReplayBufferDataModule",
]
