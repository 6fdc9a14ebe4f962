"""The DataModule's handle on a :class:`~rb_lightning.distributed.ShardedRayReplayBuffer`.

A sharded buffer is served like one Ray buffer (no re-seeding per rank, no
DataLoader workers, checkpointed once by global rank 0) with two differences:
a priority update carries the batch's ``index_generation``, so an item whose
slot was written again since it was sampled keeps its new item's priority; and
the checkpoint holds every shard (:meth:`ShardedRayReplayBuffer.dumps`).

Example (not run: needs Ray)::

    from rb_lightning.stream.handles import resolve_buffer
    handle = resolve_buffer(ShardedRayReplayBuffer(1_000, num_shards=2))
    type(handle).__name__    # 'ShardedBuffer'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from rb_lightning.checkpoint.manifest import Verify
from rb_lightning.distributed.sharded_checkpoint import restore_sharded_state, sharded_state
from rb_lightning.stream.handles import RemoteBuffer
from rb_lightning.stream.priorities import InvalidPriority, check_priority

if TYPE_CHECKING:
    from rb_lightning.distributed.sharded import ShardedRayReplayBuffer

__all__ = ["ShardedBuffer"]


class ShardedBuffer(RemoteBuffer):
    """Several Ray buffer actors sampled as one buffer, shared by every process."""

    replay_buffer: ShardedRayReplayBuffer

    def describe(self) -> str:
        rb = self.replay_buffer
        return f"{type(rb).__name__}(len={len(rb)}, {rb.num_shards} Ray shard actors)"

    def capacity(self) -> int | None:
        return self.replay_buffer.capacity

    def update_priority(
        self, batch: TensorDictBase, priority: torch.Tensor, *, invalid: InvalidPriority, where: str
    ) -> int:
        """Priorities to each item's shard; stale slots (another generation) keep theirs."""
        priority = torch.as_tensor(priority).detach().cpu().float()
        checked = check_priority(priority, invalid=invalid, replacement=lambda: 1.0, where=where)
        replaced = 0 if checked is priority else int((checked != priority).sum())
        generation = batch.get("index_generation", None)
        self.replay_buffer.update_priority(batch["index"].cpu(), checked, generation=generation)
        return replaced

    def state_dict(self, trainer: Any, *, inline_max_bytes: int, pending_batches: list[Any]) -> Any:
        """Every shard, dumped by its actor beside the ``.ckpt`` on behalf of global rank 0."""
        return sharded_state(self.replay_buffer, trainer)

    def load_state_dict(self, state: Any, trainer: Any, *, verify: Verify) -> list[Any]:
        """Rank 0 loads the shards (onto this buffer's number of shards); every rank waits."""
        restore_sharded_state(self.replay_buffer, state, trainer, verify=verify)
        return []
