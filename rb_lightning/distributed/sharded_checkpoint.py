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

from rb_lightning.checkpoint.beside import BufferDumpRequest, beside_reference, resolve_reference
from rb_lightning.checkpoint.files import remove_stale_versions, write_version
from rb_lightning.checkpoint.io import install_checkpoint_io
from rb_lightning.checkpoint.manifest import Verify, read_manifest, write_manifest
from rb_lightning.distributed.ray_checkpoint import restore_on_rank_zero
from rb_lightning.errors import BufferCheckpointError

if TYPE_CHECKING:
    from rb_lightning.distributed.sharded import ShardedRayReplayBuffer

__all__ = ["ShardedDumpRequest", "restore_sharded_state", "sharded_state"]

KIND = "sharded_ray_dumps"


class ShardedDumpRequest(BufferDumpRequest):
    """Every shard of the buffer, dumped by its actor when ``BufferCheckpointIO`` saves."""

    replay_buffer: ShardedRayReplayBuffer

    def write(self, directory: Path) -> dict[str, Any]:
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_versions(directory)

        def dump(path: Path) -> dict[str, Any]:
            rb = self.replay_buffer
            rb.dumps(path)
            content = {"kind": KIND, "len": len(rb), "write_count": rb.write_count, "build": {}}
            return write_manifest(path, {**content, "num_shards": rb.num_shards})

        version, manifest = write_version(directory, dump)
        return beside_reference(directory, version, manifest, sharded=True)

    def __reduce__(self) -> Any:
        raise BufferCheckpointError(
            "This checkpoint holds a ShardedRayReplayBuffer, which its actors write beside the "
            ".ckpt through rb_lightning's BufferCheckpointIO, and it is being saved without "
            "it. Save through a Trainer that the ReplayBufferDataModule is attached to, or "
            "pass Trainer(plugins=[BufferCheckpointIO()])."
        )


def sharded_state(replay_buffer: ShardedRayReplayBuffer, trainer: Any) -> Any:
    """What the DataModule stores: rank 0's request to dump every shard; a placeholder elsewhere."""
    if trainer is not None and trainer.global_rank != 0:
        return {"location": "remote", "saved_by_rank": 0}
    install_checkpoint_io(trainer)
    return ShardedDumpRequest(replay_buffer)


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
