"""Dumps written beside a Lightning ``.ckpt``: the requests the checkpoint dict carries, and references.

A buffer too large for the ``.ckpt`` is put in the DataModule's state as a
:class:`BufferDumpRequest`; ``BufferCheckpointIO`` writes it to ``<ckpt>.buffer/<version>/``
and stores its record (:func:`beside_reference`) in its place.

Examples:
    >>> buffer_dir_for("/runs/last.ckpt").name
    'last.ckpt.buffer'
    >>> reference = beside_reference(Path("last.ckpt.buffer"), "v1", {"len": 3, "write_count": 3})
    >>> BufferRecord.from_dict(reference).directory("/runs/last.ckpt").as_posix()
    '/runs/last.ckpt.buffer/v1'
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchrl.data import ReplayBuffer

from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.dumps import dump_buffer, dump_nbytes
from rb_lightning.persist.files import (
    check_disk_space,
    publish_version,
    remove_stale_versions,
    write_version,
)
from rb_lightning.persist.record import RANK_PREFIX, BufferRecord, RecordKind

__all__ = [
    "BUFFER_DIR_SUFFIX",
    "RANK_PREFIX",
    "BufferDumpRequest",
    "RankDumpsRequest",
    "beside_reference",
    "buffer_dir_for",
    "staging_dir_for",
]

BUFFER_DIR_SUFFIX = ".buffer"
_STAGING_DIR = ".rb_lightning-staging"


def beside_reference(
    directory: Path,
    version: str,
    manifest: dict[str, Any],
    *,
    kind: RecordKind = "beside",
    world_size: int = 1,
) -> dict[str, Any]:
    """The record the ``.ckpt`` stores for a dump written to ``directory/version`` beside it."""
    record = BufferRecord(
        kind=kind,
        len=int(manifest["len"]),
        write_count=int(manifest["write_count"]),
        dir=directory.name,
        version=version,
        world_size=world_size,
    )
    return record.to_dict()


def buffer_dir_for(checkpoint_path: str | os.PathLike) -> Path:
    """``<checkpoint>.buffer``, following symlinks (``save_last="link"``) to the real file."""
    return Path(os.path.realpath(checkpoint_path) + BUFFER_DIR_SUFFIX)


def staging_dir_for(trainer: Any) -> Path:
    """Where DDP ranks stage their dumps: beside the checkpoints (``ModelCheckpoint.dirpath``)."""
    callback = getattr(trainer, "checkpoint_callback", None)
    root = getattr(callback, "dirpath", None) or trainer.default_root_dir
    return Path(root) / _STAGING_DIR


class BufferDumpRequest:
    """Placeholder for a buffer dump, carried in the checkpoint dict until its path is known.

    :class:`~rb_lightning.checkpoint.BufferCheckpointIO` calls :meth:`write` with
    the directory beside the ``.ckpt`` and stores the reference it returns.
    Pickling it means no such plugin ran: that would copy the buffer into the
    file, so it raises instead.
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
        (:class:`~rb_lightning.errors.NotEnoughDiskSpaceError` otherwise) before
        writing anything.
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
        return beside_reference(directory, version, manifest)

    def __reduce__(self) -> Any:
        raise BufferCheckpointError(
            "This checkpoint holds a replay buffer too large to store inline, and it is being "
            "saved without rb_lightning's BufferCheckpointIO, which writes it beside the .ckpt. "
            "Save through a Trainer that the ReplayBufferDataModule is attached to (it installs "
            "the plugin), pass Trainer(plugins=[BufferCheckpointIO()]), or raise "
            "ReplayBufferDataModule(checkpoint_inline_max_bytes=...)."
        )


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
        return beside_reference(
            directory, self.version, self.manifest, kind="ranks", world_size=self.world_size
        )
