"""What a DataModule stores in a Lightning checkpoint for its buffer, and how it is restored.

One pair per kind: :func:`buffer_state` / :func:`restore_buffer_state`,
:func:`mixture_state` / :func:`restore_mixture_state`, and :func:`rank_buffer_state` (one
buffer per DDP rank). A dump up to :data:`DEFAULT_INLINE_MAX_BYTES` is packed into the
``.ckpt``; a larger one becomes a :class:`~rb_lightning.checkpoint.BufferDumpRequest` that
:class:`~rb_lightning.checkpoint.BufferCheckpointIO` writes beside it.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    >>> record = BufferRecord.from_dict(buffer_state(rb))
    >>> record.kind, record.len
    ('inline', 4)
    >>> restored = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> restore_buffer_state(restored, record), restored[:]["x"].tolist()
    ([], [0, 1, 2, 3])
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import ListStorage

from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.beside import BufferDumpRequest, RankDumpsRequest, staging_dir_for
from rb_lightning.persist.components import ensure_generator
from rb_lightning.persist.dumps import buffer_nbytes, dump_buffer, dump_nbytes, load_dump
from rb_lightning.persist.elastic import Redistribution, restore_share
from rb_lightning.persist.files import (
    check_disk_space,
    pack_directory,
    sync_path,
)
from rb_lightning.persist.manifest import Verify, read_manifest
from rb_lightning.persist.record import RANK_PREFIX, BufferRecord, mixture_record, record_dumps

if TYPE_CHECKING:
    from rb_lightning.buffers.mixture import BufferMixture

__all__ = [
    "DEFAULT_INLINE_MAX_BYTES",
    "buffer_state",
    "mixture_state",
    "rank_buffer_state",
    "restore_buffer_state",
    "restore_mixture_state",
]

#: Buffers whose storage holds at most this many bytes go inside the ``.ckpt``;
#: larger ones are written beside it. ``ReplayBufferDataModule(checkpoint_inline_max_bytes=...)``
#: overrides it (``0``: always beside).
DEFAULT_INLINE_MAX_BYTES = 64 * 1024**2


def buffer_state(
    replay_buffer: ReplayBuffer,
    *,
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
    pending_batches: Sequence[Any] = (),
) -> dict[str, Any] | BufferDumpRequest:
    """What a DataModule's ``state_dict`` holds for a buffer of this process: a packed dump up to ``inline_max_bytes`` (or a ``ListStorage``), else a :class:`~rb_lightning.checkpoint.BufferDumpRequest`."""
    ensure_generator(replay_buffer)
    small = buffer_nbytes(replay_buffer) <= inline_max_bytes
    if not small and not isinstance(replay_buffer.storage, ListStorage):
        return BufferDumpRequest(replay_buffer, pending_batches)
    check_disk_space(
        tempfile.gettempdir(), dump_nbytes(replay_buffer, pending_batches), inline=True
    )
    with tempfile.TemporaryDirectory(prefix="rb_lightning-") as tmp:
        manifest = dump_buffer(replay_buffer, Path(tmp) / "buffer", pending_batches=pending_batches)
        archive = pack_directory(Path(tmp) / "buffer")
    record = BufferRecord(
        kind="inline", len=manifest["len"], write_count=manifest["write_count"], archive=archive
    )
    return record.to_dict()


def mixture_state(
    mixture: BufferMixture,
    *,
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
    pending_batches: Sequence[Any] = (),
) -> dict[str, Any]:
    """:func:`buffer_state` of every member of ``mixture`` (the pending batches with the first) and the mixture's generator, once."""
    generator = ensure_generator(mixture)
    members: dict[str, Any] = {}
    for number, (name, member) in enumerate(mixture.members.items()):
        members[name] = buffer_state(
            member,
            inline_max_bytes=inline_max_bytes,
            pending_batches=pending_batches if number == 0 else (),
        )
    return mixture_record(
        members, None if generator is None else generator.get_state(), mixture.composition
    )


def restore_mixture_state(
    mixture: BufferMixture,
    record: BufferRecord | Mapping[str, Any],
    checkpoint_path: str | os.PathLike | None = None,
    *,
    verify: Verify = "full",
) -> list[TensorDictBase]:
    """Inverse of :func:`mixture_state`; returns the pending batches to hand out first.

    Every member's dump and the composition are verified before any member is loaded, so a
    damaged member or other fractions leave the whole mixture as it was.
    """
    record = BufferRecord.of(record)
    if not record.is_mixture:
        raise BufferCheckpointError(
            "The checkpoint holds a single replay buffer, and the DataModule samples a "
            f"BufferMixture of {mixture.names}. Resume with the buffer the checkpoint was "
            "saved with, or start a new run."
        )
    if record.names != mixture.names:
        raise BufferCheckpointError(
            f"The checkpoint holds a mixture of {record.names}, and the DataModule's "
            f"mixture has members {mixture.names}. Resume with the same member names, in the "
            "same order (their order gives the source ids)."
        )
    mixture.check_resumed_composition(record.composition)
    pending: list[TensorDictBase] = []
    with record_dumps(record, checkpoint_path) as roots:
        for root in roots.values():
            read_manifest(root, verify=verify)
        for name, member in mixture.members.items():
            pending += load_dump(member, roots[name], verify="none")  # verified
    if record.generator is not None:
        generator = ensure_generator(mixture)
        if generator is None:
            generator = torch.Generator()
        generator.set_state(record.generator)
        mixture.set_rng(generator)  # each member's own restored generator is replaced
    return pending


def rank_buffer_state(
    replay_buffer: ReplayBuffer,
    trainer: Any,
    *,
    pending_batches: Sequence[Any] = (),
) -> BufferDumpRequest:
    """Every DDP rank's buffer in one checkpoint: call on all ranks (it is collective).

    Each rank dumps into ``<checkpoint dir>/.rb_lightning-staging/<version>.tmp/rank<r>`` (one
    node or a shared filesystem); the ranks agree on ``version`` and success, and rank 0's
    ``BufferCheckpointIO`` moves the version beside the ``.ckpt`` with one rename.
    """
    strategy = trainer.strategy
    rank, world_size = trainer.global_rank, trainer.world_size
    version = strategy.broadcast(uuid.uuid4().hex, src=0)
    staged = staging_dir_for(trainer) / f"{version}.tmp"
    error: BaseException | None = None
    try:
        target = staged / f"{RANK_PREFIX}{rank}"
        target.parent.mkdir(parents=True, exist_ok=True)
        check_disk_space(target.parent, dump_nbytes(replay_buffer, pending_batches), inline=False)
        manifest = dump_buffer(
            replay_buffer,
            target,
            pending_batches=pending_batches,
            extra={"rank": rank, "world_size": world_size},
        )
        sync_path(target)  # each rank flushes its own files; rank 0 renames the whole set
    except Exception as caught:  # every rank must reach the decision below, or all hang
        error = caught
    if not strategy.reduce_boolean_decision(error is None, all=True):
        if rank == 0:
            shutil.rmtree(staged, ignore_errors=True)
        if error is not None:
            raise error
        raise BufferCheckpointError(
            "Another DDP rank failed to write its replay buffer for this checkpoint (see "
            "that rank's error); nothing was saved and the previous checkpoint is intact."
        )
    return RankDumpsRequest(staged, version, world_size, manifest)


def restore_buffer_state(
    replay_buffer: ReplayBuffer,
    record: BufferRecord | Mapping[str, Any],
    checkpoint_path: str | os.PathLike | None = None,
    *,
    rank: int = 0,
    redistribution: Redistribution | None = None,
    verify: Verify = "full",
) -> list[TensorDictBase]:
    """Inverse of :func:`buffer_state`; returns the pending batches to hand out first.

    ``record``: a :class:`~rb_lightning.persist.record.BufferRecord` or its dict. Each DDP rank
    restores its own dump (``rank``), or with a ``redistribution`` its share of all of them;
    ``verify``: what is checked first. An ``"elsewhere"`` record restores nothing.
    """
    record = BufferRecord.of(record)
    if redistribution is not None:
        return restore_share(replay_buffer, record, checkpoint_path, redistribution, verify=verify)
    if record.kind not in ("inline", "beside", "ranks", "elsewhere"):
        raise BufferCheckpointError(
            f"The checkpoint holds {record.describe()}, and the DataModule's replay buffer is "
            "a single buffer of this process. Resume with the kind of buffer the checkpoint "
            "was saved with, or start a new run."
        )
    with record_dumps(record, checkpoint_path) as dumps:
        if not dumps:
            return []
        root = dumps[f"{RANK_PREFIX}{rank}"] if record.kind == "ranks" else dumps[""]
        return load_dump(replay_buffer, root, verify=verify)
