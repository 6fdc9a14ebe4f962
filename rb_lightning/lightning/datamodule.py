"""``ReplayBufferDataModule``: a torchrl replay buffer as a LightningDataModule.

Its methods follow Lightning's hooks in the order a run calls them; what differs
between kinds of buffers is in :mod:`rb_lightning.buffers.handles`.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch.utils.data import DataLoader
from torchrl.data import ReplayBuffer

from rb_lightning.buffers.handles import BufferHandle, resolve_buffer
from rb_lightning.buffers.priorities import InvalidPriority, check_invalid_priority_mode
from rb_lightning.buffers.state import DEFAULT_INLINE_MAX_BYTES
from rb_lightning.errors import MissingKeyError
from rb_lightning.lightning.checkpoint_io import install_checkpoint_io
from rb_lightning.lightning.epochs import AUTO, check_epoch_is_bounded, epoch_length
from rb_lightning.lightning.spawn import copy_into_spawned_processes
from rb_lightning.lightning.trainer_switches import (
    RepeatedBatches,
    check_stage_has_data,
    model_dataloader,
    model_moves_batches,
    overfit_batch_count,
    refuse_weights_only_resume,
)
from rb_lightning.lightning.training import TrainingStream, check_training_options
from rb_lightning.persist.manifest import Verify, check_verify_mode
from rb_lightning.sources.buffer_sources import BufferSource, fill_for_stage, fill_sources
from rb_lightning.stream import exporters
from rb_lightning.stream.datasets import ReplayBufferBatchDataset, ReplayBufferPassDataset
from rb_lightning.stream.device_prefetch import CopyEngine
from rb_lightning.stream.loader import LoaderOptions, batch_loader
from rb_lightning.stream.rate_limiter import SamplesPerInsert, check_rate_limiter
from rb_lightning.stream.remote_prefetch import drained
from rb_lightning.stream.state import fit_loop_progress
from rb_lightning.validation import (
    check_keys,
    check_non_negative_int,
    check_positive_int,
    check_replay_buffer,
    check_seconds,
)


class ReplayBufferDataModule(LightningDataModule):
    """Serve a torchrl ``ReplayBuffer`` to ``Trainer.fit`` as whole sampled batches.

    Each training batch is one ``rb.sample(batch_size)``, a ``TensorDict`` that
    Lightning moves to the accelerator (:meth:`transfer_batch_to_device`). A
    storage on the GPU is sampled there, without a copy (docs/datasets.md, "GPU").

    Args:
        replay_buffer: The buffer to sample; a :class:`~rb_lightning.BufferMixture`
            samples named buffers as one, with a per-item ``"source"`` id.
        batch_size: Items per training batch.

    Keyword Args:
        keys: Keys to keep in each batch (nested keys as tuples); ``None`` keeps all.
        num_batches: Batches per epoch. ``"auto"``: ``ceil(len(buffer) / batch_size)``
            when the loader is built. ``None``: an unbounded stream, which
            ``limit_train_batches=<int>`` or ``max_steps`` must bound.
        num_workers: DataLoader workers. ``0`` samples in the training process
            (fastest on few cores; the only option that sees priority updates).
            With workers, ``setup`` makes a tensor storage process-shared (``rb.share()``).
        pin_memory: Pin batches for asynchronous host-to-GPU copies.
        prefetch_to_device: Start the copy of batch ``n+1`` during step ``n``:
            ``True`` on a side CUDA stream (nothing on CPU), or a
            :class:`~rb_lightning.stream.device_prefetch.CopyEngine`. Sampling and
            exact resume are unchanged.
        persistent_workers: Keep workers alive across epochs.
        batches_per_draw: Batches drawn per ``rb.sample`` call, one per step: cheaper sampling,
            the later ones miss newer writes and priorities (``BufferStream.batches_per_draw``).
        val_buffer: Buffer read once per validation run, in storage order.
        test_buffer: Same, per test run.
        min_size: Wait until the buffer holds this many items (a collector filling it).
        wait_timeout: Seconds to wait for ``min_size`` before raising.
        source: A :class:`~rb_lightning.sources.BufferSource` that fills the
            training buffer once, in :meth:`setup`.
        val_source: Same, for ``val_buffer``.
        test_source: Same, for ``test_buffer``.
        checkpoint_inline_max_bytes: Buffers up to this size (default 64 MiB)
            are saved inside the ``.ckpt``, larger ones beside it (``0``: always beside).
        checkpoint_verify: What a resume checks before loading the saved buffer:
            ``"full"`` (size and ``xxh3_64`` checksum of every file), ``"size"``,
            ``"none"``. See docs/checkpoints.md.
        invalid_priority: NaN, infinite or negative priorities in
            :meth:`update_priority`: ``"raise"``
            (:class:`~rb_lightning.errors.InvalidPriorityError`) or ``"replace"``
            with the current max priority, counted in :attr:`replaced_priorities`.
        eval_from_model: Without a ``val_buffer``/``test_buffer``, validate and
            test with the LightningModule's own ``val_dataloader()`` /
            ``test_dataloader()`` (e.g. the evaluation episodes of
            :class:`rb_lightning.rl.DQN`).
        rate_limiter: A :class:`~rb_lightning.stream.rate_limiter.SamplesPerInsert`
            that holds sampling to a replay ratio (checkpointed; ``num_workers=0``).
        resume_keep: DDP resumed on other ranks with too little room for every saved
            item: ``"all"`` raises, ``"newest"`` drops the oldest (docs/scaling.md).

    Examples:
        >>> import torch
        >>> import lightning as L
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
        >>> x = torch.randn(1_000, 4)
        >>> _ = rb.extend(TensorDict({"x": x, "y": x.sum(-1, keepdim=True)}, batch_size=[1_000]))
        >>> class Regressor(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(4, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
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
        batches_per_draw: int = 1,
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
        rate_limiter: SamplesPerInsert | None = None,
        resume_keep: Literal["all", "newest"] = "all",
    ) -> None:
        super().__init__()
        self.replay_buffer = check_replay_buffer(replay_buffer)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.keys = check_keys(keys)
        if num_batches != AUTO:
            num_batches = check_positive_int(num_batches, "num_batches", allow_none=True)
        self.num_batches = num_batches
        self.loader_options = LoaderOptions(
            num_workers, pin_memory, persistent_workers, prefetch_to_device, batches_per_draw
        )
        self.val_buffer = check_replay_buffer(val_buffer, "val_buffer", allow_none=True)
        self.test_buffer = check_replay_buffer(test_buffer, "test_buffer", allow_none=True)
        self.min_size = check_positive_int(min_size, "min_size", allow_none=True)
        self.wait_timeout = check_seconds(wait_timeout, "wait_timeout")
        self.source, self.val_source, self.test_source = source, val_source, test_source
        self._unfilled = fill_sources(
            source=(source, self.replay_buffer, "replay_buffer"),
            val_source=(val_source, self.val_buffer, "val_buffer"),
            test_source=(test_source, self.test_buffer, "test_buffer"),
        )
        self.checkpoint_inline_max_bytes = check_non_negative_int(
            checkpoint_inline_max_bytes, "checkpoint_inline_max_bytes"
        )
        self.checkpoint_verify = check_verify_mode(checkpoint_verify, "checkpoint_verify")
        self.invalid_priority = check_invalid_priority_mode(invalid_priority)
        #: NaN, infinite or negative priorities replaced so far (``invalid_priority="replace"``).
        self.replaced_priorities = 0
        # What can be checked before a Trainer exists; setup chooses the handle for its ranks.
        self._buffer: BufferHandle | None = resolve_buffer(self.replay_buffer)
        check_training_options(self._buffer, self.batch_size, self.loader_options)
        # strategy="ddp_spawn" pickles this DataModule into each rank: each gets its own copy.
        eval_buffers = [b for b in (self.val_buffer, self.test_buffer) if b is not None]
        copy_into_spawned_processes([*self._buffer.in_process_buffers(), *eval_buffers])
        self._repeated = RepeatedBatches(self._sample_batches)  # Trainer(overfit_batches=N)
        self.rate_limiter = check_rate_limiter(rate_limiter, self.num_workers)
        self._training = TrainingStream(  # the loader, its position, its device copies
            torch.initial_seed(),
            self.loader_options,
            progress=self._fit_loop_progress,
            rate_limiter=self.rate_limiter,
            consumer_version=self._policy_version,
            resume_keep=resume_keep,
        )
        # Lightning runs a loop for an overridden hook: bind val/test only with data behind.
        self.eval_from_model = bool(eval_from_model)
        for stage, buffer in (("val", self.val_buffer), ("test", self.test_buffer)):
            if buffer is not None or self.eval_from_model:
                vars(self)[f"{stage}_dataloader"] = partial(self._eval_loader, buffer, stage)
        if self.eval_from_model:
            vars(self)["predict_dataloader"] = partial(self._eval_loader, None, "predict")

    @property
    def buffer(self) -> BufferHandle:
        """The training buffer's handle, chosen in :meth:`setup` for the Trainer's world size."""
        if self._buffer is None:
            self._buffer = resolve_buffer(self.replay_buffer)
        return self._buffer

    @property
    def source_names(self) -> list[str] | None:
        """A mixture's member names: ``source_names[batch["source"][i]]`` (``None``: one buffer)."""
        return self.buffer.source_names

    @property
    def batches_served(self) -> int:
        """Training batches the training loop has taken, counted across resumed runs."""
        return self._training.state.batches_served

    @property
    def num_workers(self) -> int:  # read by OnlineCollector
        return self.loader_options.num_workers

    def _fit_loop_progress(self) -> tuple[int, bool] | None:  # a method, so it pickles
        return fit_loop_progress(self.trainer)

    def _policy_version(self) -> int:  # the learner's version: optimizer steps taken
        return self.trainer.global_step if self.trainer is not None else 0

    # -- setup ------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Choose the buffer handle; fill this stage's buffers from their sources, once each.

        The training buffer gets a generator of its own (a checkpoint restores it)
        and, with workers, a process-shared write lock (``rb.share()``, logged).
        """
        check_stage_has_data(stage, set(vars(self)))
        trainer = self.trainer
        # A model's own transfer_batch_to_device moves the batches: Lightning calls the
        # DataModule's when both override it, so show it the base hook instead.
        vars(self).pop("transfer_batch_to_device", None)  # a previous fit's choice
        if model_moves_batches(trainer, prefetch_to_device=self.loader_options.prefetch_to_device):
            base_hook = LightningDataModule.transfer_batch_to_device
            vars(self)["transfer_batch_to_device"] = base_hook.__get__(self)
        world_size = trainer.world_size if trainer is not None else 1
        self._buffer = resolve_buffer(self.replay_buffer, world_size=world_size)
        install_checkpoint_io(trainer)
        self._unfilled = fill_for_stage(self._unfilled, stage)
        self._buffer.prepare(self.num_workers)
        if stage == "fit":
            if self.rate_limiter is not None:
                self.rate_limiter.check(
                    batch_size=self.batch_size, capacity=self._buffer.capacity()
                )
            self._buffer.check_world_size(world_size)
            self._buffer.check_keys(self.keys)
            if self.num_batches is None:
                check_epoch_is_bounded(None, trainer)  # before Lightning prints or builds anything

    # -- dataloaders ------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        """Sampled batches of the training buffer."""
        num_batches = epoch_length(self.num_batches, len(self.buffer), self.batch_size)
        overfit = getattr(self.trainer, "overfit_batches", 0)  # None without a Trainer
        if overfit:  # the same batches every epoch
            return self._repeated.loader(overfit_batch_count(overfit, num_batches), num_batches)
        check_epoch_is_bounded(num_batches, self.trainer)
        check_training_options(self.buffer, self.batch_size, self.loader_options)
        return self._training.loader(
            self.buffer,
            self.batch_size,
            num_batches=num_batches,
            device=self.trainer.strategy.root_device if self.trainer is not None else None,
            keys=self.keys,
            min_size=self.min_size,
            wait_timeout=self.wait_timeout,
        )

    def _sample_batches(self, count: int) -> ReplayBufferBatchDataset:
        return ReplayBufferBatchDataset(
            self.buffer.replay_buffer,
            self.batch_size,
            keys=self.keys,
            num_batches=count,
            min_size=self.min_size,
            wait_timeout=self.wait_timeout,
        )

    def _eval_loader(self, buffer: ReplayBuffer | None, stage: str) -> Any:
        """One in-order pass over ``buffer``, else the model's own ``<stage>_dataloader()``."""
        if buffer is None:  # eval_from_model
            return model_dataloader(self.trainer, f"{stage}_dataloader", f"{stage}_buffer")
        dataset = ReplayBufferPassDataset(buffer, self.batch_size, keys=self.keys)
        return batch_loader(dataset, **self.loader_options.dataloader_kwargs())

    # -- batches on the device and back ---------------------------------------------------
    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        """A TensorDict batch in one move (or none, or a prefetch's copy); else Lightning's."""
        if isinstance(batch, TensorDictBase):
            return self._training.to_device(batch, device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def update_priority(self, batch: TensorDictBase, priority: torch.Tensor) -> None:
        """Write new priorities for the items of ``batch`` (e.g. ``|td_error|``).

        From ``training_step``: ``self.trainer.datamodule.update_priority(batch, td.abs())``.
        NaN, infinite and negative priorities: see ``invalid_priority``.
        """
        if "index" not in batch.keys():
            raise MissingKeyError(
                "keys",
                "The batch has no 'index' key. Priority updates need a buffer whose sampler "
                "returns weights (PrioritizedSampler) and keys=None or keys including 'index'.",
            )
        self.replaced_priorities += self.buffer.update_priority(
            batch,
            priority,
            invalid=self.invalid_priority,
            where="ReplayBufferDataModule.update_priority",
        )

    def teardown(self, stage: str) -> None:
        """Drop the device copies in flight; wait for priority updates sent to a Ray actor."""
        self._training.drop_copies()
        drained(self.replay_buffer)

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The buffer, the stream position, the batches read or drawn ahead, the rate limiter."""
        return self._training.state_dict(
            self.buffer, self.trainer, inline_max_bytes=self.checkpoint_inline_max_bytes
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a damaged dump: :class:`~rb_lightning.errors.BufferCheckpointError`)."""
        if state_dict.get("weights_only"):
            refuse_weights_only_resume(self.trainer)
            return
        self._training.load_state_dict(
            state_dict, self.buffer, self.trainer, verify=self.checkpoint_verify
        )

    # -- export -----------------------------------------------------------------------------
    def hf_export_defaults(self) -> exporters.ExportDefaults:
        """The training stream for :func:`~rb_lightning.hf.to_hf_dataset` ("auto": one pass)."""
        num_batches = self.num_batches
        if num_batches == AUTO:
            num_batches = max(1, math.ceil(len(self.replay_buffer) / self.batch_size))
        return exporters.ExportDefaults(
            self.replay_buffer,
            self.batch_size,
            keys=self.keys,
            num_batches=num_batches,
            min_size=self.min_size,
            wait_timeout=self.wait_timeout,
        )

    def as_hf_dataset(self, **options: Any) -> Any:
        """``to_hf_dataset(self, **options)``: the training stream for TRL (the ``hf`` extra).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
            >>> _ = rb.extend(TensorDict({"x": torch.arange(8)}, batch_size=[8]))
            >>> len(list(ReplayBufferDataModule(rb, batch_size=4).as_hf_dataset()))
            8
        """
        return exporters.export("hf", self, **options)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={self.buffer.describe()}, "
            f"batch_size={self.batch_size}, num_batches={self.num_batches!r}, {self.loader_options})"
        )


__all__ = ["ReplayBufferDataModule"]
