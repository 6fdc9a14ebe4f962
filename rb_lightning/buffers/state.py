"""What a DataModule stores in a Lightning checkpoint for its buffer, and how it is restored.

One pair of functions per kind of buffer: :func:`buffer_state` /
:func:`restore_buffer_state` (a buffer of this process), :func:`mixture_state` /
:func:`restore_mixture_state` (a :class:`~rb_lightning.BufferMixture`) and
:func:`rank_buffer_state` (one buffer per DDP rank, restored by
:func:`restore_buffer_state` on each rank). A Ray buffer's are
:func:`~rb_lightning.distributed.ray_checkpoint.remote_buffer_state` and
:func:`~rb_lightning.distributed.ray_checkpoint.restore_remote_buffer_state`.

Where a dump goes is a size policy (:data:`DEFAULT_INLINE_MAX_BYTES`): a small
buffer's dump is packed (uncompressed tar) into a ``uint8`` tensor stored in
the ``.ckpt`` itself; a larger one becomes a :class:`~rb_lightning.checkpoint.BufferDumpRequest`
that :class:`~rb_lightning.checkpoint.BufferCheckpointIO` writes beside it.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    >>> state = buffer_state(rb)  # small: packed inline, as the DataModule's state_dict holds it
    >>> state["location"], state["len"]
    ('inline', 4)
    >>> restored = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> restore_buffer_state(restored, state)
    []
    >>> restored[:]["x"].tolist(), restored.write_count
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import ListStorage

from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.beside import (
    RANK_PREFIX,
    BufferDumpRequest,
    RankDumpsRequest,
    resolve_reference,
    staging_dir_for,
)
from rb_lightning.persist.components import ensure_generator
from rb_lightning.persist.dumps import buffer_nbytes, dump_buffer, dump_nbytes, load_dump
from rb_lightning.persist.elastic import RESUME_OPTIONS, needs_redistribution, restore_share
from rb_lightning.persist.files import (
    check_disk_space,
    pack_directory,
    sync_path,
    unpacked_directory,
)
from rb_lightning.persist.manifest import Verify, read_manifest

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
    """What a DataModule puts in its ``state_dict`` for ``replay_buffer``, a buffer of this process.

    Inline (a packed dump) when the storage holds at most ``inline_max_bytes``
    bytes or is a ``ListStorage``; otherwise a :class:`~rb_lightning.checkpoint.BufferDumpRequest`
    that :class:`~rb_lightning.checkpoint.BufferCheckpointIO` writes beside the ``.ckpt``.
    """
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
    return {
        "location": "inline",
        "archive": archive,
        "len": manifest["len"],
        "write_count": manifest["write_count"],
    }


def mixture_state(
    mixture: BufferMixture,
    *,
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
    pending_batches: Sequence[Any] = (),
) -> dict[str, Any]:
    """:func:`buffer_state` of every member of ``mixture``, and the mixture's generator.

    Each member is saved as a single buffer is (inline or beside the ``.ckpt``,
    by its own size); the pending batches go with the first member. The
    generator every member samples with is saved once, as a tensor.
    """
    generator = ensure_generator(mixture)
    members: dict[str, Any] = {}
    for number, (name, member) in enumerate(mixture.members.items()):
        members[name] = buffer_state(
            member,
            inline_max_bytes=inline_max_bytes,
            pending_batches=pending_batches if number == 0 else (),
        )
    return {
        "location": "mixture",
        "names": mixture.names,
        "members": members,
        "generator": None if generator is None else generator.get_state(),
    }


def restore_mixture_state(
    mixture: BufferMixture,
    state: dict[str, Any],
    checkpoint_path: str | os.PathLike | None = None,
    *,
    verify: Verify = "full",
) -> list[TensorDictBase]:
    """Inverse of :func:`mixture_state`; returns the pending batches to hand out first.

    Every member's dump is verified (``verify``, see
    :func:`~rb_lightning.checkpoint.read_manifest`) before any member is
    loaded, so a damaged member leaves the whole mixture as it was.
    """
    if state.get("location") != "mixture":
        raise BufferCheckpointError(
            "The checkpoint holds a single replay buffer, and the DataModule samples a "
            f"BufferMixture of {mixture.names}. Resume with the buffer the checkpoint was "
            "saved with, or start a new run."
        )
    if list(state["names"]) != mixture.names:
        raise BufferCheckpointError(
            f"The checkpoint holds a mixture of {list(state['names'])}, and the DataModule's "
            f"mixture has members {mixture.names}. Resume with the same member names, in the "
            "same order (their order gives the source ids)."
        )
    pending: list[TensorDictBase] = []
    with contextlib.ExitStack() as stack:
        roots = {
            name: stack.enter_context(_dump_directory(state["members"][name], checkpoint_path))
            for name in mixture.members
        }
        for root in roots.values():
            if root is not None:
                read_manifest(root, verify=verify)
        for name, member in mixture.members.items():
            root = roots[name]
            if root is not None:
                pending += load_dump(member, root, verify="none")  # verified
    if state.get("generator") is not None:
        generator = ensure_generator(mixture)
        if generator is None:
            generator = torch.Generator()
        generator.set_state(state["generator"])
        mixture.set_rng(generator)  # each member's own restored generator is replaced
    return pending


def rank_buffer_state(
    replay_buffer: ReplayBuffer,
    trainer: Any,
    *,
    pending_batches: Sequence[Any] = (),
) -> BufferDumpRequest:
    """Every DDP rank's buffer in one checkpoint: call on all ranks (it is collective).

    Each rank dumps its own buffer into ``<staging>/<version>.tmp/rank<r>``
    (``<staging>`` is ``.rb_lightning-staging`` in the checkpoint directory, so
    every rank must see that directory: one node or a shared filesystem). The
    ranks agree on ``version`` and on success before any returns; rank 0's
    :class:`~rb_lightning.checkpoint.BufferCheckpointIO` then moves the complete version beside the
    ``.ckpt`` with one rename before it writes the ``.ckpt``.
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
    state: dict[str, Any],
    checkpoint_path: str | os.PathLike | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    verify: Verify = "full",
) -> list[TensorDictBase]:
    """Inverse of :func:`buffer_state`; returns the pending batches to hand out first.

    ``rank`` and ``world_size``: of the restoring process. A checkpoint of a DDP
    run holds one buffer per rank; each rank restores its own. Saved by another
    number of processes, every rank takes its share of all the saved items instead
    (:func:`~rb_lightning.persist.elastic.restore_share`, with the options
    :func:`~rb_lightning.persist.elastic.with_resume_options` put in ``state``).
    ``verify``: what is checked before the buffer is touched (see
    :func:`~rb_lightning.checkpoint.read_manifest`).
    """
    if needs_redistribution(state, world_size):
        options = state.get(RESUME_OPTIONS, {})
        return restore_share(
            replay_buffer,
            state,
            checkpoint_path,
            rank=rank,
            world_size=world_size,
            verify=verify,
            **options,
        )
    with _dump_directory(state, checkpoint_path, rank=rank) as root:
        if root is None:
            return []
        return load_dump(replay_buffer, root, verify=verify)


@contextlib.contextmanager
def _dump_directory(
    state: dict[str, Any],
    checkpoint_path: str | os.PathLike | None,
    *,
    rank: int = 0,
) -> Iterator[Path | None]:
    """The dump directory of a :func:`buffer_state` (an inline one unpacked meanwhile).

    ``None`` for the placeholder a rank other than 0 of a Ray run stores
    (``location="remote"``): that rank saved no buffer, so it restores nothing.
    """
    location = state.get("location")
    if location == "remote":
        yield None
        return
    if location == "inline":
        with unpacked_directory(state["archive"], checkpoint_path) as root:
            yield root
        return
    if location == "beside":
        root = resolve_reference(state, checkpoint_path)
        if "world_size" in state:
            root = root / f"{RANK_PREFIX}{rank}"
        yield root
        return
    raise BufferCheckpointError(
        f"Unknown replay-buffer location {location!r} in the checkpoint: this rb_lightning "
        "writes 'inline' and 'beside'. Resume from a checkpoint written by this version of "
        "rb_lightning, or start a new run."
    )
