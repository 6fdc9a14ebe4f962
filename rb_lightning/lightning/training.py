"""The training side of a run: the loader Lightning iterates, its position, its device copies.

:class:`TrainingStream` is what :class:`~rb_lightning.ReplayBufferDataModule`
delegates ``train_dataloader``, ``transfer_batch_to_device`` and the checkpoint
hooks to: it builds the resumable loader over a buffer handle, keeps the stream
position (:class:`~rb_lightning.stream.state.StreamState`) and the batches read
ahead of a checkpoint, and starts device copies when asked to prefetch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from rb_lightning.buffers.handles import BufferHandle
from rb_lightning.lightning.checkpoint_io import STREAM_STATE_TAG
from rb_lightning.persist.elastic import ResumeKeep, check_resume_keep, plan_redistribution
from rb_lightning.persist.manifest import Verify
from rb_lightning.persist.record import BufferRecord
from rb_lightning.stream.datasets import ReplayBufferBatchDataset
from rb_lightning.stream.device_prefetch import DevicePrefetcher, make_prefetcher, move_batch
from rb_lightning.stream.loader import LoaderOptions, ResumableBatchLoader, check_servable
from rb_lightning.stream.rate_limiter import SamplesPerInsert
from rb_lightning.stream.sampling import BufferStream, check_batches_per_draw
from rb_lightning.stream.state import StreamState

__all__ = ["TrainingStream", "check_training_options"]


def check_training_options(
    buffer: BufferHandle, batch_size: int, loader_options: LoaderOptions
) -> None:
    """Raise :class:`~rb_lightning.errors.UsageError` for options ``buffer`` cannot be trained from."""
    check_servable(buffer, batch_size, loader_options)
    check_batches_per_draw(buffer, loader_options.batches_per_draw)


class TrainingStream:
    """Sampled training batches of one buffer handle, resumable at any step.

    Args:
        seed: Base of the per-epoch, per-rank, per-worker seeds (``torch.initial_seed()``).
        loader_options: Workers, pinning and device prefetch of the loader.
        progress: Batches of the current epoch the training loop has taken and
            whether it is complete (``None`` outside a loop); see
            :func:`~rb_lightning.stream.state.fit_loop_progress`.
        rate_limiter: Gates every draw on the replay ratio; its counters are
            checkpointed with the stream.
        consumer_version: The learner's policy version (optimizer steps taken),
            given to version-gated samplers (``StalenessAwareSampler``) before each draw.
        resume_keep: A resume on another number of processes whose buffers cannot
            hold every saved item: ``"all"`` raises, ``"newest"`` drops the oldest
            (see :mod:`rb_lightning.persist.elastic`).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from rb_lightning.buffers.handles import resolve_buffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(8)}, batch_size=[8]))
        >>> stream = TrainingStream(0, LoaderOptions(), progress=lambda: None)
        >>> loader = stream.loader(resolve_buffer(rb), 4, num_batches=2, device=None)
        >>> [batch["x"].shape for batch in loader], stream.state.batches_served
        ([torch.Size([4]), torch.Size([4])], 2)
    """

    def __init__(
        self,
        seed: int,
        loader_options: LoaderOptions,
        *,
        progress: Callable[[], tuple[int, bool] | None],
        rate_limiter: SamplesPerInsert | None = None,
        consumer_version: Callable[[], int] | None = None,
        resume_keep: ResumeKeep = "all",
    ) -> None:
        self.loader_options = loader_options
        self.resume_keep = check_resume_keep(resume_keep)
        self.rate_limiter = rate_limiter
        self.consumer_version = consumer_version
        # Loaders with workers redraw what they read ahead; an in-process one keeps it.
        keep_read_ahead = loader_options.num_workers == 0
        self.state = StreamState(seed, progress=progress, keep_read_ahead=keep_read_ahead)
        # The device copies in flight of the current loader (prefetch_to_device).
        self._prefetcher: DevicePrefetcher | None = None
        # The current loader's sampling stream: the batches it drew ahead are checkpointed,
        # and restored ones wait here for the next loader's stream.
        self._sampling: BufferStream | None = None
        self._restored_draw: list[Any] = []

    def loader(
        self,
        buffer: BufferHandle,
        batch_size: int,
        *,
        num_batches: int | None,
        device: torch.device | None,
        keys: list[NestedKey] | None = None,
        min_size: int | None = None,
        wait_timeout: float = 600.0,
    ) -> ResumableBatchLoader:
        """A loader of ``num_batches`` sampled batches, continuing from :attr:`state`."""
        dataset = ReplayBufferBatchDataset(
            buffer.replay_buffer,
            batch_size,
            keys=keys,
            num_batches=num_batches,
            min_size=min_size,
            wait_timeout=wait_timeout,
            cursor=self.state.cursor,
        )
        dataset.stream.rate_limiter = self.rate_limiter
        dataset.stream.consumer_version = self.consumer_version
        dataset.stream.batches_per_draw = self.loader_options.batches_per_draw
        dataset.stream.continue_draw(self._restored_draw)
        self._restored_draw = []
        self._sampling = dataset.stream
        if device is not None:
            self._prefetcher = make_prefetcher(self.loader_options.prefetch_to_device, device)
        return ResumableBatchLoader(
            dataset,
            self.state,
            prefetcher=self._prefetcher,
            **self.loader_options.dataloader_kwargs(),
        )

    def to_device(self, batch: TensorDictBase, device: torch.device) -> TensorDictBase:
        """``batch`` on ``device``: the copy a prefetch started, the batch itself, or a copy."""
        if self._prefetcher is None and batch.device == device:
            return batch  # the common case, once per step: no further call
        pinned = self.loader_options.pin_memory
        return move_batch(batch, device, self._prefetcher, pin_memory=pinned)

    def drop_copies(self) -> None:
        """Forget the device copies still in flight (the loop that would take them ended)."""
        if self._prefetcher is not None:
            self._prefetcher.clear()

    def state_dict(
        self, buffer: BufferHandle, trainer: Any, *, inline_max_bytes: int
    ) -> dict[str, Any]:
        """The position, and the buffer with the batches read or drawn ahead of this step."""
        stream = self.state.state_dict()
        # Handed to the loop and not taken yet, then drawn and not handed out (they may open
        # the next epoch, so the resumed stream, not the loader, hands them out).
        drawn = self._restored_draw or (self._sampling.drawn_ahead() if self._sampling else [])
        pending = [*self.state.read_ahead(), *drawn]
        saved = buffer.state_dict(
            trainer, inline_max_bytes=inline_max_bytes, pending_batches=pending
        )
        state = {
            STREAM_STATE_TAG: True,
            "batches_served": stream["batches_served"],
            "stream": stream,
            "buffer": saved,
        }
        if drawn:
            state["drawn_ahead"] = len(drawn)
        if self.rate_limiter is not None:
            state["rate_limiter"] = self.rate_limiter.state_dict()
        return state

    def load_state_dict(
        self, state: dict[str, Any], buffer: BufferHandle, trainer: Any, *, verify: Verify
    ) -> None:
        """Restore :meth:`state_dict`; the read-ahead batches are handed out first (saved on another number of processes: the items are dealt anew, :func:`~rb_lightning.persist.elastic.plan_redistribution`)."""
        self.state.load_state_dict(state["stream"])
        if self.rate_limiter is not None and "rate_limiter" in state:
            self.rate_limiter.load_state_dict(state["rate_limiter"])
        saved = state.get("buffer")
        if saved is None:
            return
        record = BufferRecord.from_dict(saved)
        rank, world_size = (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)
        plan = plan_redistribution(
            record, rank, world_size, keep=self.resume_keep, stream=state["stream"]
        )
        pending = buffer.load_state_dict(record, trainer, verify=verify, redistribution=plan)
        split = max(len(pending) - int(state.get("drawn_ahead", 0)), 0)
        self.state.replay_first(pending[:split])
        self._restored_draw = pending[split:]
