"""Replay-buffer state in Lightning checkpoints: inside the ``.ckpt`` or in a directory beside it.

A resumed online RL / RLHF run needs its buffer back exactly: content, writer
cursor and ``write_count``, sampler state (priorities, the without-replacement
permutation) and the sampling generator. What a buffer dump holds on disk, and
how it is verified, is :mod:`rb_lightning.buffer_format`; this module decides
where a dump goes for a Lightning checkpoint and when it is written and removed.
Its names, and the format's, are importable from here.

Where it goes is a size policy (:data:`DEFAULT_INLINE_MAX_BYTES`):

* small buffers: the dump directory is packed (uncompressed tar) into a
  ``uint8`` tensor stored in the ``.ckpt`` itself;
* large buffers: the dump is written to ``<ckpt>.buffer/<version>/`` by
  :class:`BufferCheckpointIO`, and the ``.ckpt`` only holds a reference. The
  version is written under a temporary name and renamed when complete
  (:func:`~rb_lightning.buffer_format.write_version`), before the ``.ckpt`` is
  written, so a crash never leaves a checkpoint that points at a half-written
  buffer. It is removed together with its checkpoint (``save_top_k`` rotation
  goes through ``remove_checkpoint``).

Before a dump is written, the free space of the target filesystem is checked
(:class:`NotEnoughDiskSpaceError` instead of a ``SIGBUS`` in the middle of a
memory-mapped write). A missing or damaged buffer raises
:class:`BufferCheckpointError` naming the path, never a silently empty buffer.

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.checkpoint import buffer_state, restore_buffer_state
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
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import ListStorage

# The on-disk format, re-exported: ``rb_lightning.checkpoint`` has been its home.
from rb_lightning import buffer_format
from rb_lightning.buffer_format import (
    FORMAT_VERSION,
    MANIFEST,
    BufferCheckpointAdapter,
    BufferCheckpointError,
    NotEnoughDiskSpaceError,
    Verify,
    buffer_build,
    buffer_nbytes,
    check_disk_space,
    check_same_build,
    check_verify_mode,
    dump_buffer,
    dump_nbytes,
    dump_remote_buffer,
    ensure_generator,
    free_disk_bytes,
    load_remote_buffer,
    pack_directory,
    publish_version,
    read_manifest,
    remove_stale_versions,
    sync_path,
    unpack_directory,
    write_version,
    writes_filled_rows_only,
)
from rb_lightning.runs.run_files import LAST_CHECKPOINT, latest_checkpoint, run_checkpoint
from rb_lightning.sources.mixture import BufferMixture
from rb_lightning.stream.sharding import is_remote

__all__ = [
    "BUFFER_DIR_SUFFIX",
    "DEFAULT_INLINE_MAX_BYTES",
    "FORMAT_VERSION",
    "MANIFEST",
    "BufferCheckpointAdapter",
    "BufferCheckpointError",
    "BufferCheckpointIO",
    "BufferDumpRequest",
    "NotEnoughDiskSpaceError",
    "RankDumpsRequest",
    "RemoteDumpRequest",
    "Verify",
    "buffer_build",
    "buffer_dir_for",
    "buffer_nbytes",
    "buffer_state",
    "checkpoint_buffer_state",
    "checkpoint_dumps",
    "checkpoint_path_of",
    "check_disk_space",
    "check_same_build",
    "check_verify_mode",
    "dump_buffer",
    "dump_nbytes",
    "dump_remote_buffer",
    "ensure_generator",
    "free_disk_bytes",
    "install_checkpoint_io",
    "load_buffer",
    "load_remote_buffer",
    "mixture_state",
    "pack_directory",
    "rank_buffer_state",
    "read_manifest",
    "remote_buffer_state",
    "remove_stale_versions",
    "resolve_reference",
    "restore_buffer_state",
    "restore_mixture_state",
    "restore_remote_buffer_state",
    "staging_dir_for",
    "sync_path",
    "unpack_directory",
    "write_version",
    "writes_filled_rows_only",
]

#: Buffers whose storage holds at most this many bytes go inside the ``.ckpt``;
#: larger ones are written beside it. ``ReplayBufferDataModule(checkpoint_inline_max_bytes=...)``
#: overrides it (``0``: always beside).
DEFAULT_INLINE_MAX_BYTES = 64 * 1024**2

BUFFER_DIR_SUFFIX = ".buffer"
_RANK_PREFIX = "rank"  # <version>/rank<r>: one dump per DDP rank
_STAGING_DIR = ".rb_lightning-staging"
_PARTIAL_PREFIX = ".rb_lightning-partial-"  # a .ckpt being written, renamed into place


# -- beside the .ckpt --------------------------------------------------------------------------
def _beside_reference(
    directory: Path, version: str, manifest: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """What the ``.ckpt`` stores for a dump written to ``directory/version`` beside it."""
    return {
        "location": "beside",
        **extra,
        "dir": directory.name,
        "version": version,
        "len": manifest["len"],
        "write_count": manifest["write_count"],
    }


class BufferDumpRequest:
    """Placeholder for a buffer dump, carried in the checkpoint dict until its path is known.

    :class:`BufferCheckpointIO` replaces it with a reference once the dump is
    written next to the ``.ckpt``. Pickling it means no such plugin ran: that
    would copy the buffer into the file, so it raises instead.
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        pending_batches: Sequence[Any] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.replay_buffer = replay_buffer
        self.pending_batches = list(pending_batches)
        self.extra = extra or {}

    def write(self, directory: Path) -> dict[str, Any]:
        """Dump atomically into ``directory/<version>``; return the reference to store.

        Removes ``.tmp`` versions that earlier saves left when they died, then
        checks that the filesystem has room for the dump
        (:class:`NotEnoughDiskSpaceError` otherwise) before writing anything.
        """
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_versions(directory)
        check_disk_space(
            directory, dump_nbytes(self.replay_buffer, self.pending_batches), inline=False
        )
        version, manifest = write_version(
            directory,
            lambda path: dump_buffer(
                self.replay_buffer, path, pending_batches=self.pending_batches, extra=self.extra
            ),
        )
        return _beside_reference(directory, version, manifest)

    def __reduce__(self) -> Any:
        raise BufferCheckpointError(
            "This checkpoint holds a replay buffer too large to store inline, and it is being "
            "saved without rb_lightning's BufferCheckpointIO, which writes it beside the .ckpt. "
            "Save through a Trainer that the ReplayBufferDataModule is attached to (it installs "
            "the plugin), pass Trainer(plugins=[BufferCheckpointIO()]), or raise "
            "ReplayBufferDataModule(checkpoint_inline_max_bytes=...)."
        )


def buffer_dir_for(checkpoint_path: str | os.PathLike) -> Path:
    """``<checkpoint>.buffer``, following symlinks (``save_last="link"``) to the real file."""
    return Path(os.path.realpath(checkpoint_path) + BUFFER_DIR_SUFFIX)


def resolve_reference(reference: dict[str, Any], checkpoint_path: str | os.PathLike | None) -> Path:
    """Directory of a ``"beside"`` buffer reference stored in a checkpoint."""
    if "resolved" in reference:
        return Path(reference["resolved"])
    if checkpoint_path is None:
        raise BufferCheckpointError(
            "The checkpoint keeps its replay buffer beside the .ckpt file, but the checkpoint "
            "path is unknown. Resume with Trainer.fit(..., ckpt_path=<file>)."
        )
    return Path(os.path.realpath(checkpoint_path)).parent / reference["dir"] / reference["version"]


#: Key of the save's number in the checkpoint dict, from :class:`BufferCheckpointIO` to
#: the writer that commits it; removed before the ``.ckpt`` is written.
_SAVE_KEY = "rb_lightning_save"


class _SaveLedger:
    """Saves handed to the ``.ckpt`` writer, and what each makes obsolete once it is written.

    Saves are numbered in the order :class:`BufferCheckpointIO` hands them on; the
    writer (this thread, or ``AsyncCheckpointIO``'s one worker thread) writes them
    in that order and calls :meth:`finish` after each. Older buffer versions and
    checkpoints Lightning asked to remove are deleted only then, so until a new
    ``.ckpt`` is on disk the previous one keeps its buffer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._submitted = 0
        self._finished = 0
        self._obsolete: dict[int, list[Path]] = {}
        self._removals: list[tuple[int, Callable[[], None]]] = []

    def submit(self, obsolete: list[Path]) -> int:
        """Number a save; ``obsolete``: what to delete once its ``.ckpt`` is written."""
        with self._lock:
            self._submitted += 1
            self._obsolete[self._submitted] = obsolete
            return self._submitted

    def defer(self, removal: Callable[[], None]) -> bool:
        """Run ``removal`` after the saves handed on so far; ``False``: none pending, run it now."""
        with self._lock:
            if self._finished >= self._submitted:
                return False
            self._removals.append((self._submitted, removal))
            return True

    def finish(self, number: int | None, *, written: bool) -> None:
        """Save ``number`` ended: delete what it made obsolete (if ``written``), run due removals.

        A save that failed deletes nothing, and the removals that waited for it are
        dropped: the checkpoint Lightning meant to replace stays complete.
        """
        with self._lock:
            if number is None:  # a checkpoint that did not come through BufferCheckpointIO
                return
            obsolete = self._obsolete.pop(number, [])
            self._finished = max(self._finished, number)
            due = [removal for after, removal in self._removals if after <= number]
            self._removals = [entry for entry in self._removals if entry[0] > number]
        if not written:
            return
        for entry in obsolete:
            shutil.rmtree(entry, ignore_errors=True)
        for removal in due:
            removal()


class _CommitAfterWrite(CheckpointIO):
    """Writes the ``.ckpt`` with ``checkpoint_io``, then finishes the save in the ledger.

    Sits below ``AsyncCheckpointIO`` (so it runs in its thread, after the write) or
    directly below :class:`BufferCheckpointIO` (same thread).
    """

    def __init__(self, checkpoint_io: CheckpointIO, ledger: _SaveLedger) -> None:
        self.checkpoint_io, self.ledger = checkpoint_io, ledger

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        number = checkpoint.pop(_SAVE_KEY, None)
        try:
            _write_in_place(self.checkpoint_io, checkpoint, path, storage_options)
        except BaseException:
            self.ledger.finish(number, written=False)
            raise
        self.ledger.finish(number, written=True)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return self.checkpoint_io.load_checkpoint(
            path, map_location=map_location, **_weights_only(weights_only)
        )

    def remove_checkpoint(self, path: Any) -> None:
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        self.checkpoint_io.teardown()


def _write_in_place(
    checkpoint_io: CheckpointIO, checkpoint: dict[str, Any], path: Any, storage_options: Any
) -> None:
    """Write a local ``.ckpt`` beside its final place, ``fsync`` it, rename it over ``path``.

    ``checkpoint_io`` writes to ``<dir>/.rb_lightning-partial-<id>/<name>`` (the same
    file name, on the same filesystem); one ``os.replace`` then puts it in place and
    the directory is synced. Lightning's own writer stages in the system temporary
    directory and moves the file: across filesystems (a tmpfs ``/tmp``) the move is a
    copy, and a process killed during it leaves a truncated ``.ckpt``. Older buffer
    versions are deleted after this returns, so the new ``.ckpt`` is on disk first.
    Remote paths (``s3://...``) are written by ``checkpoint_io`` as they are.
    """
    if "://" in str(path) and not str(path).startswith("file://"):
        checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        return
    final = Path(str(path).removeprefix("file://"))
    final.parent.mkdir(parents=True, exist_ok=True)
    # Only this thread writes .ckpt files of the run (AsyncCheckpointIO has one writer),
    # so a partial directory found now belongs to a save that died.
    for stale in final.parent.glob(f"{_PARTIAL_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = final.parent / f"{_PARTIAL_PREFIX}{uuid.uuid4().hex}"
    partial.mkdir()
    try:
        checkpoint_io.save_checkpoint(
            checkpoint, partial / final.name, storage_options=storage_options
        )
        sync_path(partial / final.name)
        os.replace(partial / final.name, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    sync_path(final.parent, recursive=False)


class BufferCheckpointIO(CheckpointIO):
    """A ``CheckpointIO`` that writes large replay buffers beside the checkpoint file.

    It wraps another ``CheckpointIO`` (default: Lightning's ``TorchCheckpointIO``)
    and adds, for each :class:`BufferDumpRequest` in the checkpoint dict:
    dump to ``<ckpt>.buffer/<version>.tmp``, rename to ``<version>``, then save
    the ``.ckpt``, then delete older versions. ``remove_checkpoint`` also
    removes ``<ckpt>.buffer``.

    With Lightning's ``AsyncCheckpointIO`` (``Trainer(plugins=[AsyncCheckpointIO()])``)
    the buffer is still dumped in the training thread (a snapshot of the step being
    saved) and only the ``.ckpt`` is written in the background; older buffer
    versions, and checkpoints Lightning removes (``save_top_k``), are deleted in
    that thread after the new ``.ckpt`` is written. At every moment the newest
    complete ``.ckpt`` has its buffer on disk.

    :class:`~rb_lightning.ReplayBufferDataModule` installs it on its Trainer's
    strategy when needed; pass it explicitly as ``Trainer(plugins=[...])`` to
    wrap a custom ``CheckpointIO``.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self._ledger = _SaveLedger()
        base = checkpoint_io if checkpoint_io is not None else TorchCheckpointIO()
        if isinstance(base, AsyncCheckpointIO):
            # The commit must run after the background write, so it goes below the
            # async layer: a fresh one of the same type around it (its thread starts
            # at the first save, so nothing of the given one is lost).
            writer = type(base)()
            writer.checkpoint_io = _CommitAfterWrite(
                base.checkpoint_io or TorchCheckpointIO(), self._ledger
            )
            self.checkpoint_io: CheckpointIO = writer
        else:
            self.checkpoint_io = _CommitAfterWrite(base, self._ledger)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        directory = buffer_dir_for(path)
        # Leftovers of saves that died, beside any checkpoint of this directory
        # (each .ckpt has its own <ckpt>.buffer/, and the next save has a new name).
        # Dumps are made in this thread, so no .tmp here belongs to a live save.
        for buffer_dir in directory.parent.glob(f"*{BUFFER_DIR_SUFFIX}"):
            remove_stale_versions(buffer_dir)
        written = []
        for holder, key, request in _find_requests(checkpoint):
            reference = request.write(directory)
            holder[key] = reference
            written.append(reference["version"])
        # The new .ckpt refers to these versions only; older ones (an overwritten
        # last.ckpt) go once it is written, maybe later in AsyncCheckpointIO's thread.
        obsolete = []
        if written:
            obsolete = [entry for entry in directory.iterdir() if entry.name not in written]
        checkpoint[_SAVE_KEY] = self._ledger.submit(obsolete)
        self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        checkpoint = self.checkpoint_io.load_checkpoint(
            path, map_location=map_location, **_weights_only(weights_only)
        )
        checkpoint.pop(_SAVE_KEY, None)
        for reference in _find_references(checkpoint):
            reference["resolved"] = str(resolve_reference(reference, path))
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        """Remove ``path`` and its buffer, after the saves still being written (async IO)."""

        def remove() -> None:
            self.checkpoint_io.remove_checkpoint(path)
            shutil.rmtree(str(path) + BUFFER_DIR_SUFFIX, ignore_errors=True)

        if not self._ledger.defer(remove):
            remove()

    def teardown(self) -> None:
        self.checkpoint_io.teardown()


def _weights_only(weights_only: bool | None) -> dict[str, bool]:
    # Passed on only when given: a wrapped CheckpointIO written for an older Lightning
    # may not take the argument.
    return {} if weights_only is None else {"weights_only": weights_only}


def install_checkpoint_io(trainer: Any) -> None:
    """Wrap ``trainer.strategy.checkpoint_io`` in :class:`BufferCheckpointIO` (idempotent)."""
    strategy = getattr(trainer, "strategy", None)
    if strategy is None or isinstance(strategy.checkpoint_io, BufferCheckpointIO):
        return
    strategy.checkpoint_io = BufferCheckpointIO(strategy.checkpoint_io)


def _nested_dicts(checkpoint: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The dicts inside ``checkpoint``, at any depth (a mixture nests one state per member)."""
    for value in checkpoint.values():
        if isinstance(value, dict):
            yield value
            yield from _nested_dicts(value)


def _find_requests(checkpoint: dict[str, Any]) -> list[tuple[dict[str, Any], str, Any]]:
    found = []
    for value in _nested_dicts(checkpoint):
        found += [(value, k, v) for k, v in value.items() if isinstance(v, BufferDumpRequest)]
    return found


def _find_references(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    return [value for value in _nested_dicts(checkpoint) if value.get("location") == "beside"]


# -- the DataModule's part ---------------------------------------------------------------------
def buffer_state(
    replay_buffer: ReplayBuffer,
    *,
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
    pending_batches: Sequence[Any] = (),
) -> dict[str, Any] | BufferDumpRequest:
    """What a DataModule puts in its ``state_dict`` for ``replay_buffer``.

    Inline (a packed dump) when the storage holds at most ``inline_max_bytes``
    bytes or is a ``ListStorage``; otherwise a :class:`BufferDumpRequest` that
    :class:`BufferCheckpointIO` writes beside the ``.ckpt``. A Ray buffer
    (:func:`is_remote`) is always written beside, by its actor (see
    :func:`remote_buffer_state` for who writes it under DDP).
    """
    if is_remote(replay_buffer):
        return RemoteDumpRequest(replay_buffer)  # always beside: the actor writes it
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
    :func:`~rb_lightning.buffer_format.read_manifest`) before any member is
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
                pending += buffer_format.load_buffer(member, root, verify="none")  # verified
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
    :class:`BufferCheckpointIO` then moves the complete version beside the
    ``.ckpt`` with one rename before it writes the ``.ckpt``.
    """
    strategy = trainer.strategy
    rank, world_size = trainer.global_rank, trainer.world_size
    version = strategy.broadcast(uuid.uuid4().hex, src=0)
    staged = staging_dir_for(trainer) / f"{version}.tmp"
    error: BaseException | None = None
    try:
        target = staged / f"{_RANK_PREFIX}{rank}"
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


class RankDumpsRequest(BufferDumpRequest):
    """The per-rank dumps of one DDP checkpoint, staged and complete; moved in :meth:`write`."""

    def __init__(
        self, staged: Path, version: str, world_size: int, manifest: dict[str, Any]
    ) -> None:
        self.staged, self.version, self.world_size = staged, version, world_size
        self.manifest = manifest

    def write(self, directory: Path) -> dict[str, Any]:
        """Move the staged version to ``directory/<version>`` (one rename); return the reference."""
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_versions(directory)
        publish_version(self.staged, directory, self.version)
        # Saves of one run do not overlap: what else is staged belongs to dead saves.
        for leftover in self.staged.parent.glob("*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.staged.parent.rmdir()
        return {
            "location": "beside",
            "dir": directory.name,
            "version": self.version,
            "world_size": self.world_size,
            "len": self.manifest["len"],
            "write_count": self.manifest["write_count"],
        }


def staging_dir_for(trainer: Any) -> Path:
    """Where DDP ranks stage their dumps: beside the checkpoints (``ModelCheckpoint.dirpath``)."""
    callback = getattr(trainer, "checkpoint_callback", None)
    root = getattr(callback, "dirpath", None) or trainer.default_root_dir
    return Path(root) / _STAGING_DIR


class RemoteDumpRequest(BufferDumpRequest):
    """A Ray buffer, dumped by its actor beside the ``.ckpt`` when :class:`BufferCheckpointIO` saves.

    Lightning runs ``CheckpointIO.save_checkpoint`` on global rank 0 only, so the
    shared buffer is written once per checkpoint, whatever the number of ranks.
    """

    def __init__(self, replay_buffer: ReplayBuffer) -> None:
        super().__init__(replay_buffer)

    def write(self, directory: Path) -> dict[str, Any]:
        """Dump into ``directory/<version>.tmp`` (by the actor), rename; return the reference."""
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_versions(directory)
        version, manifest = write_version(
            directory, lambda path: dump_remote_buffer(self.replay_buffer, path)
        )
        return _beside_reference(directory, version, manifest, remote=True)

    def __reduce__(self) -> Any:
        raise BufferCheckpointError(
            "This checkpoint holds a Ray replay buffer, which its actor writes beside the "
            ".ckpt through rb_lightning's BufferCheckpointIO, and it is being saved without "
            "it. Save through a Trainer that the ReplayBufferDataModule is attached to (it "
            "installs the plugin), or pass Trainer(plugins=[BufferCheckpointIO()])."
        )


def remote_buffer_state(
    replay_buffer: ReplayBuffer, trainer: Any
) -> dict[str, Any] | BufferDumpRequest:
    """What a DataModule stores for a Ray buffer: its owner (global rank 0) dumps it.

    One actor serves every rank, so exactly one process writes it: global rank 0
    of the Lightning run (whichever process created the actor). Its request is
    carried out by :class:`BufferCheckpointIO`, which Lightning calls on rank 0
    only; other ranks return a placeholder (their checkpoint dict is not saved).
    """
    if trainer is not None and trainer.global_rank != 0:
        return {"location": "remote", "saved_by_rank": 0}
    install_checkpoint_io(trainer)
    return RemoteDumpRequest(replay_buffer)


def restore_remote_buffer_state(
    replay_buffer: ReplayBuffer,
    state: dict[str, Any],
    checkpoint_path: str | os.PathLike | None,
    trainer: Any,
    *,
    verify: Verify = "full",
) -> None:
    """Restore a Ray buffer from its checkpoint: rank 0 loads it into the actor, all ranks wait.

    Call on every rank (it is collective under DDP): no rank samples the shared
    buffer before it holds the checkpoint's content, and an error on rank 0
    stops every rank. A checkpoint written before Ray buffers were saved
    (``location="remote"``) restores nothing.
    """
    rank = trainer.global_rank if trainer is not None else 0
    world_size = trainer.world_size if trainer is not None else 1
    error: BaseException | None = None
    if rank == 0 and state.get("location") != "remote":
        try:
            if state.get("location") != "beside" or not state.get("remote"):
                raise BufferCheckpointError(
                    "The checkpoint's replay buffer was saved from a buffer in the training "
                    "process, and the DataModule now holds a Ray buffer (service_backend="
                    "'ray'). Resume with the same kind of buffer as the saved run, or start "
                    "a new run."
                )
            load_remote_buffer(
                replay_buffer, resolve_reference(state, checkpoint_path), verify=verify
            )
        except Exception as caught:  # every rank must reach the decision below, or all hang
            error = caught
    if world_size > 1 and not trainer.strategy.reduce_boolean_decision(error is None, all=True):
        if error is None:
            raise BufferCheckpointError(
                "Rank 0 could not restore the Ray replay buffer from the checkpoint (see its "
                "error); this rank stops too rather than train on the wrong content."
            )
    if error is not None:
        raise error


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
    run holds one buffer per rank; each rank restores its own, and a different
    world size raises :class:`BufferCheckpointError`. ``verify``: what is checked
    before the buffer is touched (see :func:`~rb_lightning.buffer_format.read_manifest`).
    """
    with _dump_directory(state, checkpoint_path, rank=rank, world_size=world_size) as root:
        if root is None:
            return []
        return buffer_format.load_buffer(replay_buffer, root, verify=verify)


@contextlib.contextmanager
def _dump_directory(
    state: dict[str, Any],
    checkpoint_path: str | os.PathLike | None,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[Path | None]:
    """The dump directory of a :func:`buffer_state` (an inline one unpacked meanwhile).

    ``None`` for a placeholder that restores nothing (``location="remote"``).
    """
    location = state.get("location")
    if location == "remote":
        yield None
        return
    saved_world = int(state.get("world_size", 1))
    if saved_world != world_size:
        raise BufferCheckpointError(
            f"The checkpoint holds the replay buffers of {saved_world} process(es) (one per "
            f"DDP rank), and it is being resumed with world_size={world_size}. Each rank "
            "restores the buffer it saved, so the number of processes must match: resume "
            f"with Trainer(devices=..., num_nodes=...) giving {saved_world} process(es) in "
            "all, or start a new run and refill the buffers."
        )
    if location == "inline":
        with tempfile.TemporaryDirectory(prefix="rb_lightning-") as tmp:
            unpack_directory(state["archive"], tmp)
            yield Path(tmp)
        return
    if location == "beside":
        root = resolve_reference(state, checkpoint_path)
        if "world_size" in state:
            root = root / f"{_RANK_PREFIX}{rank}"
        yield root
        return
    raise BufferCheckpointError(
        f"Unknown replay-buffer location {location!r} in the checkpoint (expected 'inline' or "
        "'beside'); was it written by a newer rb_lightning?"
    )


# -- reading a Lightning run's buffer ----------------------------------------------------------
def checkpoint_path_of(path: str | os.PathLike) -> Path | None:
    """The Lightning checkpoint that ``path`` names, or ``None`` when it names none.

    A file is itself; a run directory (``runs/<config>/version_<N>``) means its
    ``checkpoints/last.ckpt``, a ``checkpoints`` directory the ``last.ckpt`` in it,
    and a config's directory of runs (``runs/<config>``) the ``last.ckpt``
    written most recently by any of its runs.

    Examples:
        >>> checkpoint_path_of("no/such/run") is None
        True
    """
    location = Path(path)
    if location.is_file():
        return location
    if not location.is_dir():
        return None
    in_run = run_checkpoint(location)
    if in_run is not None:
        return in_run
    if (location / LAST_CHECKPOINT).is_file():
        return location / LAST_CHECKPOINT
    return latest_checkpoint(location)


def read_torch_file(path: str | os.PathLike, *, allow_pickle: bool = False) -> Any:
    """``torch.load(path)`` with ``weights_only=True`` unless ``allow_pickle``.

    A Lightning checkpoint of a run with a :class:`~rb_lightning.ReplayBufferDataModule`
    holds tensors, numbers, strings and containers only, so it is read without
    unpickling anything. A file that holds other objects (``torch.save(rb, path)``
    of a whole buffer object) is refused with a :class:`BufferCheckpointError`
    naming them, unless ``allow_pickle=True``: unpickling can run any code, so
    only for files you trust.
    """
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError:
        if allow_pickle:
            raise
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        if any(name.endswith("replay_buffers.ReplayBuffer") for name in found):
            what = "a whole ReplayBuffer object pickled by torch.save(rb, path)"
        elif any(name.startswith("tensordict.") for name in found):
            what = "a TensorDict pickled by torch.save(td, path)"
        else:
            what = f"pickled Python objects ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''})"
        raise BufferCheckpointError(
            f"{path} holds {what}: reading it means unpickling, which can run any code, so it "
            "is refused. If you made the file yourself and trust it, pass allow_pickle=True "
            "(rb-lightning-export-hf --allow-pickle); to share a buffer, save it with "
            "rb_lightning.checkpoint.dump_buffer(rb, path) instead (tensors and JSON only)."
        ) from None
    except (RuntimeError, EOFError, ValueError) as error:
        raise BufferCheckpointError(
            f"{path} is not a file written by torch.save or a Lightning checkpoint "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})."
        ) from None


def checkpoint_buffer_state(checkpoint: Any) -> dict[str, Any] | None:
    """The replay-buffer state a ``ReplayBufferDataModule`` saved in a loaded checkpoint dict.

    Lightning stores a DataModule's ``state_dict`` under its class name; this
    finds it by content (a ``"buffer"`` entry with a ``"location"``), so a
    subclass of the DataModule is found too. ``None`` when there is none.

    Examples:
        >>> checkpoint_buffer_state({"ReplayBufferDataModule": {"buffer": {"location": "inline"}}})
        {'location': 'inline'}
        >>> checkpoint_buffer_state({"state_dict": {}}) is None
        True
    """
    if not isinstance(checkpoint, dict):
        return None
    for value in checkpoint.values():
        if isinstance(value, dict):
            buffer = value.get("buffer")
            if isinstance(buffer, dict) and "location" in buffer:
                return buffer
    return None


@contextlib.contextmanager
def checkpoint_dumps(
    state: dict[str, Any], checkpoint_path: str | os.PathLike
) -> Iterator[dict[str, Path]]:
    """The dump directories behind a saved buffer state, by name, for :func:`load_buffer`.

    ``{"": dir}`` for one buffer, ``{member: dir}`` for a :class:`BufferMixture`
    (in source-id order), ``{"rank0": dir, ...}`` for the per-rank buffers of a
    DDP run. A buffer saved inside the ``.ckpt`` is unpacked into a temporary
    directory that is removed on exit; one saved beside it is read in place
    (a Ray buffer's content is saved there by its actor).
    """
    location = state.get("location")
    with contextlib.ExitStack() as stack:
        if location == "mixture":
            dumps: dict[str, Path] = {}
            for name in state["names"]:
                member = stack.enter_context(
                    checkpoint_dumps(state["members"][name], checkpoint_path)
                )
                dumps[name] = member[""]
            yield dumps
        elif location == "inline":
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rb_lightning-"))
            unpack_directory(state["archive"], tmp)
            yield {"": Path(tmp)}
        elif location == "beside":
            root = resolve_reference(state, checkpoint_path)
            if "world_size" in state:
                yield {
                    f"{_RANK_PREFIX}{rank}": root / f"{_RANK_PREFIX}{rank}"
                    for rank in range(int(state["world_size"]))
                }
            else:
                yield {"": root}
        elif location == "remote":
            raise BufferCheckpointError(
                f"{checkpoint_path} was saved by a DDP rank other than 0 of a run with a Ray "
                "buffer: the buffer is in rank 0's checkpoint. Read that one."
            )
        else:
            raise BufferCheckpointError(
                f"Unknown replay-buffer location {location!r} in {checkpoint_path}; was it "
                "written by a newer rb_lightning?"
            )


def load_buffer(
    replay_buffer: ReplayBuffer,
    path: str | os.PathLike,
    *,
    member: str | None = None,
    rank: int | None = None,
    verify: Verify = "full",
) -> list[TensorDictBase]:
    """Restore ``replay_buffer`` from a dump, a Lightning checkpoint or a run directory.

    ``path`` is a :func:`dump_buffer` directory (read by
    :func:`rb_lightning.buffer_format.load_buffer`), a ``.ckpt`` written by a run
    with a :class:`~rb_lightning.ReplayBufferDataModule` (the buffer inside it or
    beside it), or a run directory (``runs/<config>/version_<N>``: its
    ``checkpoints/last.ckpt``; see :func:`checkpoint_path_of`). The checkpoint is
    read with ``torch.load(weights_only=True)``. ``replay_buffer`` must be built
    like the saved one (storage, capacity, sampler, writer).

    Keyword Args:
        member: The member to read from a checkpoint of a :class:`BufferMixture`
            (pass the whole mixture as ``replay_buffer`` to restore every member).
        rank: The rank whose buffer to read from a checkpoint of a DDP run.
        verify: What is checked before the buffer is touched
            (see :func:`~rb_lightning.buffer_format.read_manifest`).

    Returns:
        The batches the run had read ahead of the saved step (for an exact resume).

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
        >>> path = f"{tempfile.mkdtemp()}/last.ckpt"
        >>> torch.save({"ReplayBufferDataModule": {"buffer": buffer_state(rb)}}, path)
        >>> restored = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> load_buffer(restored, path), restored[:]["x"].tolist()
        ([], [0, 1, 2])
    """
    location = Path(path)
    checkpoint = checkpoint_path_of(location)
    if checkpoint is None or (location.is_dir() and (location / MANIFEST).is_file()):
        return buffer_format.load_buffer(replay_buffer, location, verify=verify)
    state = checkpoint_buffer_state(read_torch_file(checkpoint))
    if state is None:
        raise BufferCheckpointError(
            f"{checkpoint} holds no replay buffer: it was not written by a run whose DataModule "
            "is a ReplayBufferDataModule."
        )
    if state.get("location") == "mixture" and isinstance(replay_buffer, BufferMixture):
        return restore_mixture_state(replay_buffer, state, checkpoint, verify=verify)
    with checkpoint_dumps(state, checkpoint) as dumps:
        name = _pick_dump(dumps, state, checkpoint, member=member, rank=rank)
        return buffer_format.load_buffer(replay_buffer, dumps[name], verify=verify)


def _pick_dump(
    dumps: dict[str, Path],
    state: dict[str, Any],
    checkpoint: Path,
    *,
    member: str | None,
    rank: int | None,
) -> str:
    """The one dump of ``dumps`` that ``member`` / ``rank`` select; raise when ambiguous."""
    mixture = state.get("location") == "mixture"
    if member is not None and not mixture:
        raise BufferCheckpointError(
            f"member={member!r}, but {checkpoint} holds one buffer, not a BufferMixture: "
            "drop member."
        )
    if rank is not None and "world_size" not in state:
        raise BufferCheckpointError(
            f"rank={rank}, but {checkpoint} holds the buffer of a single process, not one per "
            "DDP rank: drop rank."
        )
    if mixture:
        if member not in dumps:
            given = "no member" if member is None else f"member={member!r}"
            raise BufferCheckpointError(
                f"{checkpoint} holds a BufferMixture of {list(dumps)}, and {given} was given. "
                "Pass member=<one of them> (--member on the command line), or restore into a "
                "BufferMixture with those members."
            )
        return member
    if "world_size" in state:
        name = f"{_RANK_PREFIX}{rank}"
        if name not in dumps:
            given = "no rank" if rank is None else f"rank={rank}"
            raise BufferCheckpointError(
                f"{checkpoint} holds one buffer per DDP rank ({len(dumps)} ranks), and {given} "
                f"was given. Pass rank=0 to {len(dumps) - 1} (--rank on the command line)."
            )
        return name
    return ""
