"""Putting dumps on disk safely: atomic versions, ``fsync``, disk-space checks, cleanup, packing.

A dump becomes visible by one rename once complete and flushed (:func:`write_version`),
so a reader never finds half of one, even after a crash; :func:`check_disk_space` refuses
a dump that would not fit (a memory-mapped write out of space dies of ``SIGBUS``);
:func:`pack_directory` turns a dump into one tensor for a ``.ckpt``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rb_lightning.errors import NotEnoughDiskSpaceError, RBLightningError

__all__ = [
    "check_disk_space",
    "errors_naming",
    "free_disk_bytes",
    "in_use",
    "is_in_use",
    "pack_directory",
    "publish_version",
    "remove_stale_versions",
    "sync_path",
    "unpack_directory",
    "unpacked_directory",
    "write_version",
]

#: Free space asked for on top of a dump's estimated size: manifests, JSON files and
#: filesystem blocks are not counted in the estimate.
_DISK_MARGIN_FRACTION = 0.05
_DISK_MARGIN_BYTES = 256 * 1024


# -- disk space --------------------------------------------------------------------------------
def free_disk_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk_space(path: str | os.PathLike, nbytes: int, *, inline: bool) -> None:
    """Raise :class:`NotEnoughDiskSpaceError` unless ``path``'s filesystem fits ``nbytes`` + margin.

    A memory-mapped dump out of space dies of ``SIGBUS``; this turns that into a message.
    ``inline``: the dump is staged in the temporary directory (the fix differs).
    """
    needed = int(nbytes * (1 + _DISK_MARGIN_FRACTION)) + _DISK_MARGIN_BYTES
    free = free_disk_bytes(path)
    if needed <= free:
        return
    if inline:
        fix = (
            "A buffer of at most checkpoint_inline_max_bytes is dumped to this temporary "
            "directory before it is packed into the .ckpt. Point TMPDIR at a filesystem with "
            "more space, or lower ReplayBufferDataModule(checkpoint_inline_max_bytes=...) "
            "(0: always beside the .ckpt) so the buffer is written beside the checkpoint."
        )
    else:
        fix = (
            "Free space there, or save checkpoints to a larger filesystem "
            "(ModelCheckpoint(dirpath=...) or Trainer(default_root_dir=...)); keeping fewer "
            "checkpoints (save_top_k) also frees space. Buffers up to "
            "ReplayBufferDataModule(checkpoint_inline_max_bytes=...) go inside the .ckpt instead."
        )
    raise NotEnoughDiskSpaceError(
        f"Not enough free disk space to checkpoint the replay buffer: the dump needs about "
        f"{needed / 1e6:.1f} MB in {path}, and that filesystem has {free / 1e6:.1f} MB free. "
        f"Nothing was written, so the previous checkpoint is intact. {fix}"
    )


# -- packed (one tensor, e.g. inside a Lightning .ckpt) ---------------------------------------
def pack_directory(path: str | os.PathLike) -> torch.Tensor:
    """The files under ``path`` as an uncompressed tar archive in a ``uint8`` tensor."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        archive.add(str(path), arcname=".")
    return torch.frombuffer(bytearray(stream.getvalue()), dtype=torch.uint8)


def unpack_directory(archive: torch.Tensor, path: str | os.PathLike) -> None:
    """Extract an archive made by :func:`pack_directory` into ``path``."""
    with tarfile.open(fileobj=io.BytesIO(archive.numpy().tobytes()), mode="r") as tar:
        tar.extractall(path, filter="data")


@contextlib.contextmanager
def unpacked_directory(
    archive: torch.Tensor, checkpoint_path: str | os.PathLike | None
) -> Iterator[Path]:
    """An archive of :func:`pack_directory`, unpacked in a temporary directory removed on exit; errors inside name ``checkpoint_path`` instead."""
    with tempfile.TemporaryDirectory(prefix="rb_lightning-") as tmp:
        unpack_directory(archive, tmp)
        where = str(checkpoint_path) if checkpoint_path is not None else "the checkpoint"
        with errors_naming({tmp: where}):
            yield Path(tmp)


@contextlib.contextmanager
def errors_naming(names: dict[str, str]) -> Iterator[None]:
    """Inside, an rb_lightning error raised with a path of ``names`` says what it names instead.

    Examples:
        >>> with errors_naming({"/tmp/x1": "last.ckpt"}):
        ...     raise RBLightningError("/tmp/x1 is damaged")
        Traceback (most recent call last):
        ...
        rb_lightning.errors.RBLightningError: last.ckpt is damaged
    """
    try:
        yield
    except RBLightningError as error:
        for path, name in names.items():
            error.args = tuple(
                arg.replace(path, name) if isinstance(arg, str) else arg for arg in error.args
            )
        raise


# -- atomic versions ---------------------------------------------------------------------------
def sync_path(path: str | os.PathLike, *, recursive: bool = True) -> None:
    """``fsync`` ``path``: a file, or a directory with (``recursive``) everything under it, so a rename survives a crash with its data."""
    root = Path(path)
    entries = [root]
    if recursive and root.is_dir():
        entries = sorted(root.rglob("*"), reverse=True) + [root]  # children before parents
    for entry in entries:
        descriptor = os.open(entry, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def write_version(
    directory: str | os.PathLike, dump: Callable[[Path], dict[str, Any]]
) -> tuple[str, dict[str, Any]]:
    """Write one dump as the new version ``directory/<version>``, atomically; return both.

    ``dump(path)`` writes into ``<version>.tmp`` and returns its manifest; the directory is
    synced and renamed once complete, so a reader never finds half a version, even after a
    crash; a failed dump is removed at once. Versions are new names, so an older one stays
    readable until its ``.ckpt`` is replaced.

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from rb_lightning.checkpoint import dump_buffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(2)}, batch_size=[2]))
        >>> root = tempfile.mkdtemp()
        >>> version, manifest = write_version(root, lambda path: dump_buffer(rb, path))
        >>> sorted(p.name for p in Path(root).iterdir()) == [version], manifest["len"]
        (True, 2)
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    version = uuid.uuid4().hex
    staging = directory / f"{version}.tmp"
    try:
        manifest = dump(staging)
        sync_path(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    os.replace(staging, directory / version)
    sync_path(directory, recursive=False)
    return version, manifest


def publish_version(staged: Path, directory: Path, version: str) -> Path:
    """Move a complete, synced dump ``staged`` to ``directory/<version>``: one rename, or across filesystems a synced copy under ``.tmp`` first."""
    final = directory / version
    try:
        os.replace(staged, final)
    except OSError:  # another filesystem: copy under a temporary name, then rename
        copy = directory / f"{version}.tmp"
        shutil.copytree(staged, copy)
        sync_path(copy)
        os.replace(copy, final)
        shutil.rmtree(staged, ignore_errors=True)
    sync_path(directory, recursive=False)
    return final


# Paths a save of this process is still writing in another thread (a chunked save's staged
# version and chunks, rb_lightning.persist.chunks): not a dead save's, so never removed.
_IN_USE: set[str] = set()
_IN_USE_LOCK = threading.Lock()


@contextlib.contextmanager
def in_use(paths: list[Path]) -> Iterator[None]:
    """Mark ``paths`` as being written by a live save meanwhile: :func:`remove_stale_versions` keeps them.

    Examples:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "live.tmp").mkdir()
        >>> with in_use([root / "live.tmp"]):
        ...     remove_stale_versions(root)
        []
    """
    names = [os.path.abspath(path) for path in paths]
    with _IN_USE_LOCK:
        _IN_USE.update(names)
    try:
        yield
    finally:
        with _IN_USE_LOCK:
            _IN_USE.difference_update(names)


def is_in_use(path: str | os.PathLike) -> bool:
    """Whether a live save of this process is writing ``path`` (see :func:`in_use`)."""
    with _IN_USE_LOCK:
        return os.path.abspath(path) in _IN_USE


def remove_stale_versions(directory: str | os.PathLike) -> list[Path]:
    """Remove ``<version>.tmp`` directories under ``directory``; return what was removed.

    A version is staged under ``.tmp`` and renamed once complete, so a ``.tmp``
    that exists when a new save starts belongs to a save that died (killed, out
    of disk) and only takes the space the new one needs, unless a save of this
    process still writes it in another thread (:func:`in_use`).

    Examples:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "dead.tmp").mkdir()
        >>> (root / "kept").mkdir()
        >>> [p.name for p in remove_stale_versions(root)], [p.name for p in root.iterdir()]
        (['dead.tmp'], ['kept'])
    """
    removed: list[Path] = []
    try:
        entries = list(Path(directory).glob("*.tmp"))
    except FileNotFoundError:
        # Gone while listed: the buffer of an older checkpoint, deleted by Lightning's
        # AsyncCheckpointIO thread during this save. Nothing of it is left to clean.
        return removed
    for entry in entries:
        if entry.is_dir() and not is_in_use(entry):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
