"""Checkpoints of a Ray buffer (``service_backend="ray"``): its actor writes and reads the dump.

One actor serves every rank, so global rank 0 has it write its content with torchrl's
``dumps`` beside the ``.ckpt`` (:class:`RemoteDumpRequest`; for a ``ShardedRayReplayBuffer``
every shard), and on resume loads it back while every rank waits. Importing this module
does not import Ray.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchrl.data import ReplayBuffer

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.lightning.checkpoint_io import install_checkpoint_io
from rb_lightning.persist.beside import BufferDumpRequest, beside_reference
from rb_lightning.persist.build import build_record, compare_builds
from rb_lightning.persist.files import remove_stale_versions, write_version
from rb_lightning.persist.layouts import actor_dump_layout
from rb_lightning.persist.manifest import (
    Verify,
    check_plain_files,
    read_manifest,
    write_manifest,
)
from rb_lightning.persist.record import BufferRecord, RecordKind

__all__ = [
    "RemoteDumpRequest",
    "dump_remote_buffer",
    "load_remote_buffer",
    "remote_buffer_state",
    "restore_on_rank_zero",
    "restore_remote_buffer_state",
]

_WRONG_KIND = (
    "The checkpoint's replay buffer{where} was saved from a buffer in the training process, "
    "and the DataModule now holds a Ray buffer (service_backend='ray'). Resume with the same "
    "kind of buffer as the saved run, or start a new run."
)


def remote_build(replay_buffer: ReplayBuffer) -> dict[str, Any]:
    """The build record of a Ray buffer (see :func:`~rb_lightning.checkpoint.buffer_build`), read in its actor."""
    from rb_lightning.distributed.ray import remote_build as describe_in_actor

    parts = describe_in_actor(replay_buffer, list(torchrl_compat.SAMPLER_SETTINGS))
    attributes = parts.pop("sampler_attributes")
    return build_record(parts, attributes)


def dump_remote_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> dict[str, Any]:
    """Have a Ray buffer's actor write its content to the new directory ``path``; return the manifest.

    One actor call with torchrl's ``dumps`` (its one pickle, an empty prefetch state, is
    checked), so a collector's writes land before or after it; ``path`` must be reachable
    from the actor. The manifest is written by this process.
    """
    from rb_lightning.distributed.ray import dump_in_actor

    root = Path(path).absolute()
    build = remote_build(replay_buffer)
    length, write_count = dump_in_actor(replay_buffer, str(root))
    if not root.is_dir():
        raise BufferCheckpointError(
            f"The Ray replay buffer's actor wrote its checkpoint to {root}, and this process "
            "does not see it there: the actor runs on another machine. Save checkpoints to "
            "a filesystem that the actor's node and the rank-0 trainer share "
            "(ModelCheckpoint(dirpath=...) on a shared mount), or run the actor on the "
            "rank-0 node (named_actor_config(..., resources=...))."
        )
    check_plain_files(root, written=True)
    return write_manifest(
        root,
        {
            "layout": actor_dump_layout(length),
            "len": length,
            "write_count": write_count,
            "pending_batches": 0,
            "build": build,
            "remote": True,
        },
        {},  # the actor wrote the files in its own process: hashed here from disk
    )


def load_remote_buffer(
    replay_buffer: ReplayBuffer, path: str | os.PathLike, *, verify: Verify = "full"
) -> None:
    """Replace a Ray buffer's content, in its actor, with a :func:`dump_remote_buffer` directory (verified here first; ``path`` reachable from the actor)."""
    from rb_lightning.distributed.ray import load_in_actor

    root = Path(path).absolute()
    manifest = read_manifest(root, verify=verify)
    if not manifest.get("remote"):
        raise BufferCheckpointError(_WRONG_KIND.format(where=f" ({root})"))
    check_plain_files(root)
    compare_builds(manifest["build"], remote_build(replay_buffer), root)
    empty = manifest["len"] == 0
    length, write_count = load_in_actor(replay_buffer, None if empty else str(root))
    if length != manifest["len"] or (not empty and write_count != manifest["write_count"]):
        raise BufferCheckpointError(
            f"The Ray replay buffer restored from {root} holds {length} items (write_count "
            f"{write_count}), its manifest says {manifest['len']} ({manifest['write_count']}). "
            "Resume from an earlier checkpoint; if that fails the same way, report it with "
            "this message."
        )


class RemoteDumpRequest(BufferDumpRequest):
    """A buffer served by Ray actors, dumped by them beside the ``.ckpt`` when ``BufferCheckpointIO`` saves (on global rank 0 only: once per checkpoint).

    ``dump`` writes a new version directory and returns its manifest (default:
    :func:`dump_remote_buffer`); ``kind`` is the record's kind (``"actor"``, ``"shards"``);
    ``what`` names the buffer in the error raised when the request is pickled.

    Examples:
        >>> import pickle
        >>> request = RemoteDumpRequest(None, lambda path: {}, what="ShardedRayReplayBuffer")
        >>> pickle.dumps(request)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rb_lightning.errors.BufferCheckpointError: This checkpoint holds a ShardedRayReplayBuffer, ...
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        dump: Callable[[Path], dict[str, Any]] | None = None,
        *,
        kind: RecordKind = "actor",
        what: str = "Ray replay buffer",
    ) -> None:
        super().__init__(replay_buffer)
        self.dump = dump or (lambda path: dump_remote_buffer(self.replay_buffer, path))
        self.kind, self.what = kind, what

    def write(self, directory: Path) -> dict[str, Any]:
        """Dump into ``directory/<version>.tmp`` (by the actors), rename; return the reference."""
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_versions(directory)
        version, manifest = write_version(directory, self.dump)
        return beside_reference(directory, version, manifest, kind=self.kind)

    def __reduce__(self) -> Any:
        raise BufferCheckpointError(
            f"This checkpoint holds a {self.what}, which its Ray actors write beside the "
            ".ckpt through rb_lightning's BufferCheckpointIO, and it is being saved without "
            "it. Save through a Trainer that the ReplayBufferDataModule is attached to (it "
            "installs the plugin), or pass Trainer(plugins=[BufferCheckpointIO()])."
        )


def remote_buffer_state(
    replay_buffer: ReplayBuffer, trainer: Any, request: RemoteDumpRequest | None = None
) -> dict[str, Any] | BufferDumpRequest:
    """What a DataModule stores for a Ray buffer: global rank 0 has it dumped (``request``, default ``RemoteDumpRequest``); other ranks store an ``"elsewhere"`` placeholder."""
    if trainer is not None and trainer.global_rank != 0:
        return BufferRecord(kind="elsewhere").to_dict()
    install_checkpoint_io(trainer)
    return RemoteDumpRequest(replay_buffer) if request is None else request


def restore_remote_buffer_state(
    replay_buffer: ReplayBuffer,
    record: BufferRecord,
    checkpoint_path: str | os.PathLike | None,
    trainer: Any,
    *,
    verify: Verify = "full",
) -> None:
    """Restore a Ray buffer: rank 0 loads it into the actor, every rank waits (collective under DDP; an error on rank 0 stops all)."""

    def load() -> None:
        if record.kind != "actor":
            raise BufferCheckpointError(_WRONG_KIND.format(where=""))
        load_remote_buffer(replay_buffer, record.directory(checkpoint_path), verify=verify)

    restore_on_rank_zero(record, trainer, load, what="Ray replay buffer")


def restore_on_rank_zero(
    record: BufferRecord, trainer: Any, load: Callable[[], None], *, what: str
) -> None:
    """Rank 0 runs ``load`` (unless ``record`` is a placeholder) and every rank reaches the same decision, so an error stops them all."""
    rank = trainer.global_rank if trainer is not None else 0
    world_size = trainer.world_size if trainer is not None else 1
    error: BaseException | None = None
    if rank == 0 and record.kind != "elsewhere":
        try:
            load()
        except Exception as caught:  # every rank must reach the decision below, or all hang
            error = caught
    if world_size > 1 and not trainer.strategy.reduce_boolean_decision(error is None, all=True):
        if error is None:
            raise BufferCheckpointError(
                f"Rank 0 could not restore the {what} from the checkpoint (see its error); "
                "this rank stops too rather than train on the wrong content."
            )
    if error is not None:
        raise error
