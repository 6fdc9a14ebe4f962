"""How many batches a training epoch has, and whether the Trainer bounds an unbounded one."""

from __future__ import annotations

import math
from typing import Any, Final, Literal

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Timer

from rb_lightning.errors import BufferStateError, UsageError

#: ``num_batches="auto"``: one buffer's worth of batches per epoch.
AUTO: Final = "auto"

__all__ = ["AUTO", "check_epoch_is_bounded", "epoch_length"]


def epoch_length(
    num_batches: int | Literal["auto"] | None, size: int, batch_size: int
) -> int | None:
    """Batches per epoch: ``num_batches`` as given, or ``ceil(size / batch_size)`` for ``"auto"``.

    Under DDP every rank takes the smallest rank's ``"auto"`` length: ranks whose
    local buffers differ in size must agree, or the longest one waits forever in
    its last gradient sync.

    Examples:
        >>> epoch_length("auto", size=1_000, batch_size=256), epoch_length(None, 0, 256)
        (4, None)
    """
    if num_batches != AUTO:
        return num_batches  # an int or None
    if size == 0:
        raise BufferStateError(
            "num_batches='auto' sizes an epoch from the buffer, but the replay buffer is "
            "empty. Fill it before fit, or, for a buffer that a collector fills during fit, "
            "pass num_batches=None and bound the epoch with Trainer(limit_train_batches=N).",
            argument="num_batches",
        )
    count = math.ceil(size / batch_size)
    if dist.is_available() and dist.is_initialized():
        total = torch.tensor([count])
        dist.all_reduce(total, op=dist.ReduceOp.MIN)
        count = int(total.item())
    return count


def has_time_limit(trainer: Any) -> bool:
    """Whether ``Trainer(max_time=...)`` stops the run mid-epoch (a timer checked after every step; an epoch-end one would wait forever)."""
    return any(
        isinstance(callback, Timer)
        and callback.time_remaining() is not None
        # Lightning keeps the interval private and has no accessor for it.
        and getattr(callback, "_interval", "step") == "step"
        for callback in trainer.callbacks
    )


def check_epoch_is_bounded(num_batches: int | None, trainer: Any) -> None:
    """Refuse an unbounded stream (``num_batches=None``) that no Trainer setting stops."""
    if num_batches is not None or trainer is None:
        return
    limit = trainer.limit_train_batches
    bounded_by_limit = isinstance(limit, int) and not isinstance(limit, bool)
    bounded_by_steps = trainer.max_steps is not None and trainer.max_steps >= 0
    if not (bounded_by_limit or bounded_by_steps or has_time_limit(trainer)):
        raise UsageError(
            "num_batches",
            "ReplayBufferDataModule(num_batches=None) is an unbounded stream, and this "
            f"Trainer has no bound for it (limit_train_batches={limit!r}, "
            f"max_steps={trainer.max_steps}, no max_time): the first epoch would never end. "
            "Set Trainer(limit_train_batches=<int>) to make every epoch that many batches, "
            "or Trainer(max_steps=<int>), or Trainer(max_time=...), or give the DataModule num_batches=<int> (in a "
            "config: trainer.limit_train_batches, trainer.max_steps, "
            "trainer.max_time, data.init_args.num_batches).",
        )
