"""Checkpoints of a :class:`~rb_lightning.distributed.ShardedRayReplayBuffer` beside the ``.ckpt``.

Global rank 0 (the process Lightning saves from) has every shard actor write its
part (:meth:`ShardedRayReplayBuffer.dumps`) into a new version directory beside
the ``.ckpt``; the manifest and checksums are :mod:`rb_lightning.checkpoint`'s.
On resume rank 0 verifies the dump and loads it (onto the same shard layout as
saved, or spread over another number of shards) while every rank waits.
The directory must be reachable from the shard actors' node (a shared filesystem
across machines).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rb_lightning.checkpoint.beside import resolve_reference
from rb_lightning.checkpoint.manifest import Verify, read_manifest, write_manifest
from rb_lightning.distributed.ray_checkpoint import (
    RemoteDumpRequest,
    remote_buffer_state,
    restore_on_rank_zero,
)
from rb_lightning.errors import BufferCheckpointError

if TYPE_CHECKING:
    from rb_lightning.distributed.sharded import ShardedRayReplayBuffer

__all__ = ["ShardedDumpRequest", "dump_shards", "restore_sharded_state", "sharded_state"]

KIND = "sharded_ray_dumps"

#: The old name of the one actor dump request (one release): build one with sharded_state.
ShardedDumpRequest = RemoteDumpRequest


def dump_shards(replay_buffer: ShardedRayReplayBuffer, path: Path) -> dict[str, Any]:
    """Every shard dumped by its actor into the new directory ``path``; return the manifest."""
    replay_buffer.dumps(path)
    content = {
        "kind": KIND,
        "len": len(replay_buffer),
        "write_count": replay_buffer.write_count,
        "build": {},
    }
    return write_manifest(path, {**content, "num_shards": replay_buffer.num_shards})


def sharded_state(replay_buffer: ShardedRayReplayBuffer, trainer: Any) -> Any:
    """What the DataModule stores: rank 0's request to dump every shard; a placeholder elsewhere."""
    request = RemoteDumpRequest(
        replay_buffer,
        lambda path: dump_shards(replay_buffer, path),
        mark="sharded",
        what="ShardedRayReplayBuffer",
    )
    return remote_buffer_state(replay_buffer, trainer, request)


def restore_sharded_state(
    replay_buffer: ShardedRayReplayBuffer, state: Any, trainer: Any, *, verify: Verify
) -> None:
    """Rank 0 verifies and loads the saved shards; every rank waits for it (collective)."""

    def load() -> None:
        if not state.get("sharded"):
            raise BufferCheckpointError(
                "The checkpoint's replay buffer was not saved from a ShardedRayReplayBuffer, "
                "and the DataModule now holds one. Resume with the same kind of buffer as "
                "the saved run, or start a new run."
            )
        path = resolve_reference(state, trainer.ckpt_path if trainer is not None else None)
        read_manifest(path, verify=verify)
        replay_buffer.loads(path)

    restore_on_rank_zero(state, trainer, load, what="ShardedRayReplayBuffer")
