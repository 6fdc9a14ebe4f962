"""The on-disk format of a replay-buffer dump: what :func:`dump_buffer` writes and :func:`load_buffer` reads.

A dump is a directory of memory-mapped tensors (``.memmap``) and JSON, never a
pickle, with a ``manifest.json`` that records the item count, ``write_count``,
how the buffer was built (storage, capacity, sampler and its settings,
writer), and the size and xxHash (``xxh3_64``) checksum of every file. The
checksums of the data are taken from the bytes as they are written, not by
reading the files back. Loading verifies all of it before the buffer is
touched (``verify``: ``"full"``, ``"size"`` or ``"none"``), refuses a directory
holding any other file (it could run code when read) and refuses a buffer built
differently from the saved one, each with a :class:`BufferCheckpointError` that
names the path, the file and the fix.

Kinds of dump (manifest ``"kind"``), chosen by :func:`dump_buffer`:

* ``filled_rows``: a tensor storage that has not wrapped writes rows ``[0, len)``
  only, restored into a buffer of the saved capacity (checkpoints sized by content);
* ``whole_storage``: a wrapped storage, written by its own checkpointer;
* ``list_items``: a ``ListStorage``, one memory-mapped TensorDict per item;
* ``empty_buffer``: no data yet, only writer, sampler and generator state.

Sampler and writer state go through their own ``dumps`` (JSON and memmaps), the
sampling generator as a memory-mapped tensor. Dumps written by earlier versions
are still read.

Atomic versions: :func:`write_version` writes a dump under ``<version>.tmp`` and
renames it to ``<version>`` once complete and flushed to disk (``fsync`` of every
file, the manifest and the directories before and after the rename), so a reader
never sees a half-written dump, even after a machine crash;
:func:`remove_stale_versions` removes what a save that died left behind.
Where versions live beside a Lightning ``.ckpt`` is :mod:`rb_lightning.checkpoint`'s job.

torchrl's own ``torchrl.checkpoint.Checkpoint`` can hold such a dump as one of its
components through :class:`BufferCheckpointAdapter` (see docs/checkpoints.md for why
this format is not torchrl's ``dumps`` layout).

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.buffer_format import dump_buffer, load_buffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = dump_buffer(rb, f"{tmp}/buf")
    ...     restored = ReplayBuffer(storage=LazyTensorStorage(10))
    ...     _ = load_buffer(restored, f"{tmp}/buf")
    >>> restored[:]["x"].tolist(), restored.write_count
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

import io
import json
import mmap
import os
import shutil
import tarfile
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import xxhash
from tensordict import TensorDict, TensorDictBase
from torchrl.checkpoint import CheckpointAdapter
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    TensorStorage,
)

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError, NotEnoughDiskSpaceError
from rb_lightning.stream.sharding import is_remote

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "BufferCheckpointAdapter",
    "BufferCheckpointError",
    "NotEnoughDiskSpaceError",
    "VERIFY_MODES",
    "Verify",
    "buffer_build",
    "buffer_nbytes",
    "check_disk_space",
    "check_same_build",
    "dump_buffer",
    "dump_nbytes",
    "dump_remote_buffer",
    "ensure_generator",
    "free_disk_bytes",
    "load_buffer",
    "load_remote_buffer",
    "pack_directory",
    "read_manifest",
    "check_verify_mode",
    "remove_stale_versions",
    "sync_path",
    "unpack_directory",
    "write_version",
    "writes_filled_rows_only",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_PENDING = "pending_batches"
# Kinds of dump (manifest "kind"); each is tensors (raw memmaps) and JSON only.
_LIST_ITEMS = "list_items"  # ListStorage: one memmapped TensorDict per item, in _LIST_DIR
_LIST_DIR = "items"
_EMPTY = "empty_buffer"  # no data yet: writer, sampler and generator state
_WHOLE_STORAGE = "whole_storage"  # a wrapped tensor storage, written by its checkpointer
_TRANSFORM_STATE = "transform.t"  # a transform's state_dict: loaded with weights_only=True
# torchrl's own ``dumps`` layout: written by a Ray buffer's actor, and by earlier versions.
_TORCHRL_DUMPS = "torchrl_dumps"
_REMOTE_EMPTY = "remote_empty"  # a Ray buffer with no data: nothing but the manifest
# Kinds written by earlier versions, still read (pickles only through safe loaders).
_LEGACY_PREFETCH = "prefetch.pkl"
_LEGACY_LIST = "list_state_dict"
_LEGACY_LIST_STATE = "list_storage_state.pt"
_LEGACY_EMPTY = "empty"
_LEGACY_EMPTY_STATE = "empty_buffer_state.pt"
_WEIGHTS_ONLY_FILES = (_TRANSFORM_STATE, _LEGACY_LIST_STATE, _LEGACY_EMPTY_STATE)
#: Files a dump may hold besides the ones above: JSON and raw tensor bytes.
_SAFE_SUFFIXES = (".json", ".memmap")
#: Kind of dump that holds only the filled rows of a tensor storage that has not wrapped.
_FILLED_ROWS = "filled_rows"
_TENSOR_ROWS = "_rows"  # key of a plain-tensor storage's rows in the saved TensorDict
#: Storage types whose filled rows are the whole content (others: written whole by torchrl).
_ROW_STORAGES = (TensorStorage, LazyTensorStorage, LazyMemmapStorage)
#: Free space asked for on top of a dump's estimated size: manifests, JSON files and
#: filesystem blocks are not counted in the estimate.
_DISK_MARGIN_FRACTION = 0.05
_DISK_MARGIN_BYTES = 256 * 1024
#: Manifest key of the per-file checksums: hex ``xxh3_64`` digests, for every file.
_CHECKSUMS = "xxh3_64"
#: Manifest key of dumps written before every file was checksummed: CRC32 of small files.
_LEGACY_CRC32 = "crc32"
#: Window in which a file is mapped to verify its checksum (a multiple of the mmap granularity).
_READ_CHUNK_BYTES = 64 * 1024**2

#: What :func:`load_buffer` checks before loading: ``"full"`` every file's size and
#: checksum, ``"size"`` every file's size, ``"none"`` only that the manifest is readable.
Verify = Literal["full", "size", "none"]
VERIFY_MODES: tuple[str, ...] = ("full", "size", "none")


# -- sizes and RNG -----------------------------------------------------------------------------
def buffer_nbytes(replay_buffer: ReplayBuffer) -> int:
    """Bytes a dump of ``replay_buffer``'s storage would take (its allocated capacity)."""
    storage = replay_buffer.storage
    if isinstance(storage, TensorStorage):
        data = torchrl_compat.storage_content(storage) if storage.initialized else None
        if data is None:
            return 0
        if isinstance(data, torch.Tensor):
            return data.numel() * data.element_size()
        if isinstance(data, TensorDictBase):
            return int(data.bytes())
        return sum(t.numel() * t.element_size() for t in _tensor_leaves(data))
    total = 0
    for item in torchrl_compat.storage_content(storage) or []:
        if isinstance(item, TensorDictBase):
            total += int(item.bytes())
        elif isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
    return total


def writes_filled_rows_only(replay_buffer: ReplayBuffer) -> bool:
    """Whether a dump of ``replay_buffer`` holds only its filled rows (see the module doc).

    True for a ``TensorStorage`` / ``LazyTensorStorage`` / ``LazyMemmapStorage``
    with one storage dimension that holds data and has not wrapped
    (``0 < len < max_size``), keeps torchrl's default storage checkpointer, and
    whose buffer has no prefetch queue and no stateful transform (those are
    written by torchrl's ``dumps`` only). Everything else is written whole.
    """
    storage = replay_buffer.storage
    if type(storage) not in _ROW_STORAGES or not storage.initialized:
        return False
    return (
        getattr(storage, "ndim", 1) == 1
        and 0 < len(storage) < storage.max_size
        and isinstance(torchrl_compat.storage_content(storage), (TensorDictBase, torch.Tensor))
        and not torchrl_compat.has_custom_checkpointer_hooks(storage)
        and not torchrl_compat.has_prefetch(replay_buffer)
        and not replay_buffer.transform.state_dict()
    )


def dump_nbytes(replay_buffer: ReplayBuffer, pending_batches: Sequence[Any] = ()) -> int:
    """Estimated bytes :func:`dump_buffer` writes for ``replay_buffer`` (without margin).

    The storage (its filled rows when :func:`writes_filled_rows_only`, else its
    capacity), a prioritized sampler's two trees (``2 x 8`` bytes per slot) and
    the pending batches.
    """
    nbytes = buffer_nbytes(replay_buffer)
    if writes_filled_rows_only(replay_buffer):
        storage = replay_buffer.storage
        nbytes = -(-nbytes * len(storage) // storage.max_size)
    sampler = getattr(replay_buffer, "sampler", None)
    nbytes += 16 * int(torchrl_compat.sampler_attribute(sampler, "max_capacity") or 0)
    for batch in pending_batches:
        if isinstance(batch, TensorDictBase):
            nbytes += int(batch.bytes())
    return nbytes


def free_disk_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk_space(path: str | os.PathLike, nbytes: int, *, inline: bool) -> None:
    """Raise :class:`NotEnoughDiskSpaceError` unless ``path``'s filesystem fits ``nbytes`` + margin.

    A memory-mapped dump that runs out of space does not fail with an error: the
    process dies with ``SIGBUS``. Checking first turns that into a message.
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


def ensure_generator(replay_buffer: ReplayBuffer) -> torch.Generator | None:
    """Give ``replay_buffer`` its own ``torch.Generator`` if it has none, and return it.

    Without one, torchrl samplers draw from torch's (or numpy's) global RNG,
    which a checkpoint cannot restore. The new generator lives on the storage's
    device (samplers draw indices there) and is seeded from
    ``torch.initial_seed()`` (set by ``seed_everything``), offset so that it
    does not replay the global stream. Returns ``None`` while the device is
    still unknown (a lazy storage with ``device="auto"`` and no data yet), and
    for a remote buffer (:func:`is_remote`).
    """
    if is_remote(replay_buffer):
        return None
    generator = torchrl_compat.buffer_generator(replay_buffer)
    if generator is not None:
        return generator
    device = getattr(replay_buffer.storage, "device", None)
    if isinstance(device, str) and device == "auto":
        return None
    generator = torch.Generator(device=torch.device(device) if device is not None else "cpu")
    generator.manual_seed((torch.initial_seed() + 0x9E3779B9) % 2**63)
    replay_buffer.set_rng(generator)
    return generator


# -- manifest ----------------------------------------------------------------------------------
def _files(root: Path) -> dict[str, int]:
    return {
        path.relative_to(root).as_posix(): path.stat().st_size
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def _crc(path: Path) -> int:
    return zlib.crc32(path.read_bytes())


def _tensor_digest(tensor: torch.Tensor) -> str:
    """``xxh3_64`` of a CPU tensor's bytes, read in place (no copy)."""
    flat = tensor.detach().reshape(-1)
    return xxhash.xxh3_64_hexdigest(flat.view(torch.uint8).numpy().data)


def _file_digest(path: Path) -> str:
    """``xxh3_64`` of a file's bytes, hashed through read-only mappings of a window at a time.

    Mapped (with ``MAP_POPULATE`` where there is one: pages of the page cache are
    mapped in one call) rather than read into a buffer: no copy, about 3x faster.
    """
    digest = xxhash.xxh3_64()
    size = path.stat().st_size
    with open(path, "rb") as file:
        for offset in range(0, size, _READ_CHUNK_BYTES):
            length = min(_READ_CHUNK_BYTES, size - offset)
            with _map_read_only(file.fileno(), length, offset) as window:
                digest.update(window)
    return digest.hexdigest()


def _map_read_only(descriptor: int, length: int, offset: int) -> mmap.mmap:
    if os.name != "posix":
        return mmap.mmap(descriptor, length, access=mmap.ACCESS_READ, offset=offset)
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(descriptor, length, flags=flags, prot=mmap.PROT_READ, offset=offset)


class _Digests(dict[str, str]):
    """Checksums of dump files, by path relative to the dump root, taken as they are written.

    ``add_written``: a TensorDict that ``TensorDict.memmap`` just wrote; each leaf maps
    its own file, so the digest is of the bytes in the file's pages, through the mapping
    that wrote them (no second read of the file). ``add_source``: a TensorDict that
    torchrl's checkpointer is writing under ``prefix`` (``key.memmap`` per leaf); the
    digest is of the bytes it copies. Files not covered here (JSON, sampler and writer
    state) are small and hashed from disk when the manifest is written.
    """

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root.absolute()

    def add_written(self, data: TensorDictBase) -> None:
        for leaf in data.values(include_nested=True, leaves_only=True):
            filename = getattr(leaf, "filename", None)
            if isinstance(leaf, torch.Tensor) and filename:
                self._add(Path(filename), leaf)

    def add_source(self, data: Any, prefix: Path) -> None:
        if not isinstance(data, TensorDictBase):
            return
        for key, leaf in data.items(include_nested=True, leaves_only=True):
            if isinstance(leaf, torch.Tensor) and not leaf.is_cuda:
                parts = (key,) if isinstance(key, str) else tuple(key)
                self._add(prefix.joinpath(*parts[:-1], f"{parts[-1]}.memmap"), leaf)

    def _add(self, file: Path, tensor: torch.Tensor) -> None:
        try:
            name = file.absolute().relative_to(self.root).as_posix()
        except ValueError:
            return  # not a file of this dump
        # Recorded only if the file is exactly the tensor's bytes; otherwise read later.
        nbytes = tensor.numel() * tensor.element_size()
        if tensor.is_contiguous() and file.is_file() and file.stat().st_size == nbytes:
            self[name] = _tensor_digest(tensor)


def _write_manifest(
    root: Path, content: dict[str, Any], digests: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write ``manifest.json``: ``content``, the size and checksum of every file.

    ``digests``: checksums taken while the files were written (:class:`_Digests`),
    or ``None`` for a dump recorded by size only (``dump_buffer(checksums=False)``).
    """
    files = _files(root)
    content = dict(content)
    content["format"] = FORMAT_VERSION
    content["files"] = files
    if digests is not None:
        content[_CHECKSUMS] = {
            name: digests.get(name) or _file_digest(root / name) for name in files
        }
    # Kept (empty) so that rb_lightning versions before per-file checksums read the dump.
    content[_LEGACY_CRC32] = {}
    with open(root / MANIFEST, "w") as file:
        json.dump(content, file)
        file.flush()
        os.fsync(file.fileno())
    return content


def check_verify_mode(verify: str, argument: str = "verify") -> Verify:
    """``verify`` if it is one of :data:`VERIFY_MODES`; otherwise a ``ValueError`` naming ``argument``."""
    if verify not in VERIFY_MODES:
        raise ValueError(
            f"{argument}={verify!r} is not a verification mode: use 'full' (sizes and "
            "checksums of every file of a buffer checkpoint, the default), 'size' (file sizes "
            "only, for multi-GB buffers on disks you trust) or 'none'."
        )
    return verify  # type: ignore[return-value]


def _what_file_holds(name: str) -> str:
    """What the dump file ``name`` (relative path) holds, in a user's words."""
    parts = name.split("/")
    column = parts[-1].removesuffix(".memmap")

    def column_of(inner: list[str]) -> str:
        key = [*inner, column]
        return f"column {'.'.join(key)!r}" if len(key) > 1 else f"column {column!r}"

    if not name.endswith(".memmap"):
        return "metadata"
    if parts[0] == "storage":
        if parts[1:] == [f"{_TENSOR_ROWS}.memmap"]:
            return "the stored tensor"
        return f"{column_of(parts[1:-1])} of the stored items"
    if parts[0] == _LIST_DIR and len(parts) > 2:
        return f"{column_of(parts[2:-1])} of item {parts[1]}"
    if parts[0] == _PENDING and len(parts) > 2:
        return f"{column_of(parts[2:-1])} of read-ahead batch {parts[1]}"
    if parts[0] in ("sampler", "writer"):
        return f"the {parts[0]} state ({column})"
    if parts[0] == "rng_state":
        return "the sampling generator state"
    return column_of(parts[:-1])


def _corrupted(root: Path, name: str, problem: str) -> BufferCheckpointError:
    return BufferCheckpointError(
        f"Replay-buffer dump {root} is corrupted: {name} ({_what_file_holds(name)}) {problem}. "
        "Nothing was loaded; the buffer is unchanged. Resume from an earlier checkpoint (an "
        "older .ckpt with its .buffer directory); this one's data is damaged on disk."
    )


def read_manifest(path: str | os.PathLike, *, verify: Verify = "full") -> dict[str, Any]:
    """Read and verify the manifest of a buffer dump; raise :class:`BufferCheckpointError`.

    ``verify``: ``"full"`` (default) checks the size and the checksum of every file
    (dumps of older versions: of the files they recorded one for), ``"size"`` the
    sizes only, ``"none"`` nothing but a readable manifest of a known format.
    """
    root = Path(path)
    if root.is_file():
        raise BufferCheckpointError(
            f"{root} is a file, and a replay-buffer dump is a directory (written by "
            "dump_buffer). To read the buffer of a Lightning checkpoint (.ckpt) or a run "
            "directory, use rb_lightning.checkpoint.load_buffer(rb, path)."
        )
    if not root.is_dir():
        raise BufferCheckpointError(
            f"The checkpoint refers to a replay-buffer directory that does not exist: {root}. "
            "It is written beside the .ckpt and must be kept (or copied) with it; resume from "
            "a checkpoint whose buffer directory is present."
        )
    manifest_path = root / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as error:
        raise BufferCheckpointError(
            f"The replay-buffer directory {root} has no readable {MANIFEST} ({error}): the dump "
            "is incomplete or damaged. Resume from an earlier checkpoint."
        ) from error
    if manifest.get("format") != FORMAT_VERSION:
        raise BufferCheckpointError(
            f"{manifest_path} has format {manifest.get('format')!r}; this rb_lightning reads "
            f"format {FORMAT_VERSION}."
        )
    if verify == "none":
        return manifest
    actual = _files(root)
    for name, size in manifest["files"].items():
        if actual.get(name) != size:
            found = "is missing" if name not in actual else f"holds {actual[name]} bytes"
            raise _corrupted(root, name, f"should hold {size} bytes and {found}")
    if verify == "size":
        return manifest
    for name, digest in manifest.get(_CHECKSUMS, {}).items():
        if _file_digest(root / name) != digest:
            raise _corrupted(root, name, "does not match its checksum (xxh3_64)")
    for name, crc in manifest.get(_LEGACY_CRC32, {}).items():
        if _crc(root / name) != crc:
            raise _corrupted(root, name, "does not match its checksum (crc32)")
    return manifest


# -- dump / load -------------------------------------------------------------------------------
def dump_buffer(
    replay_buffer: ReplayBuffer,
    path: str | os.PathLike,
    *,
    pending_batches: Sequence[Any] = (),
    extra: dict[str, Any] | None = None,
    checksums: bool = True,
) -> dict[str, Any]:
    """Write ``replay_buffer`` to the new directory ``path`` and return its manifest.

    Only memory-mapped tensors and JSON are written, never a pickle, so loading
    runs no code from the files: a tensor storage that has not wrapped writes
    its filled rows (:func:`writes_filled_rows_only`), a full one its whole
    storage through the storage's checkpointer; a ``ListStorage`` one
    memory-mapped TensorDict per item; sampler and writer through their own
    ``dumps`` (JSON and memmaps), the generator state as a memmapped tensor.

    Args:
        replay_buffer: The buffer to save.
        path: A directory that must not exist yet.

    Keyword Args:
        pending_batches: Batches already sampled but not yet consumed by training
            (TensorDicts), saved so a resumed run hands them out first.
        extra: JSON-serialisable values recorded in the manifest.
        checksums: Record an ``xxh3_64`` checksum of every file (default). ``False``
            records sizes only (a baseline for measuring what checksums cost).

    The checksums of the data are taken from the bytes being written (a storage
    must not be written by another thread during a save: the dump would be torn
    anyway). Files are not ``fsync``-ed here; :func:`write_version` does it.
    """
    root = Path(path)
    root.mkdir(parents=True)
    storage = replay_buffer.storage
    extra = dict(extra or {})
    digests = _Digests(root)
    if isinstance(storage, ListStorage):
        kind = _LIST_ITEMS
        extra.update(_dump_list_items(replay_buffer, root, digests))
    elif not getattr(storage, "initialized", True) or len(replay_buffer) == 0:
        # torchrl refuses to dump a storage that never received data.
        kind = _EMPTY
        _dump_components(replay_buffer, root, digests)
    elif writes_filled_rows_only(replay_buffer):
        kind = _FILLED_ROWS
        extra.update(_dump_filled_rows(replay_buffer, root, digests))
    else:
        kind = _WHOLE_STORAGE
        with torchrl_compat.ignore_last_cursor_warning():
            storage.dumps(root / "storage")
        # torchrl's checkpointer copies the storage's leaves into storage/<key>.memmap.
        digests.add_source(torchrl_compat.storage_content(storage), root / "storage")
        extra.update(capacity=storage.max_size, **_dump_components(replay_buffer, root, digests))
        transform_state = replay_buffer.transform.state_dict()
        if transform_state:
            torch.save(transform_state, root / _TRANSFORM_STATE)  # tensors: weights-only loadable
    for number, batch in enumerate(pending_batches):
        if not isinstance(batch, TensorDictBase):
            raise TypeError(
                f"pending batch {number} is a {type(batch).__name__}; only TensorDict batches "
                "can be saved for an exact resume."
            )
        digests.add_written(_on_host(batch).memmap(root / _PENDING / str(number)))
    _refuse_pickles(root, written=True)
    return _write_manifest(
        root,
        {
            "kind": kind,
            "len": len(replay_buffer),
            "write_count": torchrl_compat.write_count(replay_buffer),
            "pending_batches": len(pending_batches),
            "build": buffer_build(replay_buffer),
            **extra,
        },
        digests if checksums else None,
    )


def load_buffer(
    replay_buffer: ReplayBuffer, path: str | os.PathLike, *, verify: Verify = "full"
) -> list[TensorDictBase]:
    """Restore ``replay_buffer`` from a :func:`dump_buffer` directory; return its pending batches.

    The current content of ``replay_buffer`` is replaced. Raises
    :class:`BufferCheckpointError` naming ``path`` when the directory is
    missing, does not match its manifest (``verify``, see :func:`read_manifest`:
    checked before the buffer is touched), or holds a file that could run code
    when read (a pickle): nothing in it is unpickled.
    """
    root = Path(path)
    manifest = read_manifest(root, verify=verify)
    _refuse_pickles(root)
    check_same_build(manifest.get("build"), replay_buffer, root)
    kind = manifest["kind"]
    if kind == _LIST_ITEMS:
        _load_list_items(replay_buffer, root, manifest)
    elif kind == _FILLED_ROWS:
        _load_filled_rows(replay_buffer, root, manifest)
    elif kind == _EMPTY:
        replay_buffer.empty()
        _load_components(replay_buffer, root, manifest, sampler=False)
    elif kind == _LEGACY_EMPTY:
        _load_legacy_empty(replay_buffer, root)
    elif kind == _REMOTE_EMPTY:
        replay_buffer.empty()
    elif kind in (_WHOLE_STORAGE, _TORCHRL_DUMPS):
        _require(
            isinstance(replay_buffer.storage, TensorStorage),
            root,
            "a tensor storage",
            replay_buffer,
        )
        _load_whole_storage(replay_buffer, root, manifest)
        torchrl_compat.restore_non_tensor_columns(replay_buffer, root / "storage")
    elif kind == _LEGACY_LIST:
        _load_legacy_list(replay_buffer, root)
    else:
        raise BufferCheckpointError(
            f"The replay-buffer dump {root} is of kind {kind!r}, which this rb_lightning cannot "
            "read; was it written by a newer rb_lightning?"
        )
    if (
        len(replay_buffer) != manifest["len"]
        or torchrl_compat.write_count(replay_buffer) != manifest["write_count"]
    ):
        raise BufferCheckpointError(
            f"Replay buffer loaded from {root} holds {len(replay_buffer)} items (write_count "
            f"{torchrl_compat.write_count(replay_buffer)}), its manifest says {manifest['len']} "
            f"({manifest['write_count']}). {_cause_beyond_build(manifest)}"
        )
    return [
        TensorDict.load_memmap(root / _PENDING / str(number), allow_pickle=False).clone()
        for number in range(manifest.get("pending_batches", 0))
    ]


def buffer_build(replay_buffer: ReplayBuffer) -> dict[str, Any]:
    """How ``replay_buffer`` is built, as far as it shapes the sampled stream (JSON-able).

    Storage, sampler and writer classes, the capacity and the sampler's settings
    (``alpha``, ``beta``, ``eps``, ``max_capacity`` of a ``PrioritizedSampler``;
    ``drop_last``, ``shuffle`` of a ``SamplerWithoutReplacement``). Recorded in
    every dump's manifest and compared on load by :func:`check_same_build`. For a
    Ray buffer (:func:`is_remote`) it is read inside the actor.
    """
    if is_remote(replay_buffer):
        from rb_lightning.ray import remote_build

        parts = remote_build(replay_buffer, list(torchrl_compat.SAMPLER_SETTINGS))
        attributes = parts.pop("sampler_attributes")
    else:
        sampler = replay_buffer.sampler
        parts = {
            "storage": type(replay_buffer.storage).__name__,
            "capacity": int(replay_buffer.storage.max_size),
            "sampler": type(sampler).__name__,
            "writer": type(replay_buffer.writer).__name__,
        }
        attributes = {
            attribute: getattr(sampler, attribute, None)
            for attribute in torchrl_compat.SAMPLER_SETTINGS
        }
    settings = {
        name: attributes[attribute]
        for attribute, name in torchrl_compat.SAMPLER_SETTINGS.items()
        if isinstance(attributes.get(attribute), (bool, int, float))
    }
    return {**parts, "sampler_settings": settings}


def check_same_build(saved: dict[str, Any] | None, replay_buffer: ReplayBuffer, root: Path) -> None:
    """Raise :class:`BufferCheckpointError` when ``replay_buffer`` is built unlike the saved one.

    A resumed run with another sampler or writer would silently drop state (a
    ``PrioritizedSampler``'s priorities) or draw another stream; the message names
    each difference, saved vs given. Dumps of older versions carry no record:
    nothing to compare.
    """
    if not saved:
        return
    given = buffer_build(replay_buffer)
    differences = []
    for part in ("storage", "capacity", "sampler", "writer"):
        if saved.get(part) != given[part]:
            name = "max_size" if part == "capacity" else part
            differences.append(f"saved {name}={saved.get(part)}, given {name}={given[part]}")
    if saved.get("sampler") == given["sampler"]:
        saved_settings = saved.get("sampler_settings", {})
        for name, value in saved_settings.items():
            if given["sampler_settings"].get(name) != value:
                differences.append(
                    f"saved {given['sampler']}({name}={value}), given "
                    f"{given['sampler']}({name}={given['sampler_settings'].get(name)})"
                )
    if differences:
        raise BufferCheckpointError(
            f"The replay buffer saved in {root} was built differently from the one it is "
            f"being restored into ({'; '.join(differences)}). Resuming would drop the saved "
            "sampler or writer state or change the sampled stream. Build the replay buffer "
            "with the saved storage, capacity, sampler (and its settings) and writer, or "
            "start a new run instead of resuming this checkpoint."
        )


def _refuse_pickles(root: Path, *, written: bool = False) -> None:
    """Raise unless every file under ``root`` is JSON, a raw memmap or a weights-only file.

    ``written``: checking a dump just made (a non-tensor value that only pickle can
    store), rather than one about to be read (a file that could run code).
    """
    for file in sorted(root.rglob("*")):
        if not file.is_file() or file.suffix in _SAFE_SUFFIXES:
            continue
        name = file.relative_to(root).as_posix()
        if file.name in _WEIGHTS_ONLY_FILES:
            continue  # read with torch.load(weights_only=True): tensors and containers only
        if file.name == _LEGACY_PREFETCH and torchrl_compat.is_empty_prefetch_pickle(file):
            continue  # torchrl's dumps of a buffer without prefetch (older rb_lightning)
        if written:
            shutil.rmtree(root, ignore_errors=True)
            raise BufferCheckpointError(
                f"The replay buffer holds a value that can only be saved as a pickle ({name}): "
                "rb_lightning checkpoints store tensors, strings and numbers only, so that "
                "loading one can never run code. Store such values as tensors or strings "
                "(NonTensorData of str/int/float/list/dict)."
            )
        raise BufferCheckpointError(
            f"The replay-buffer dump {root} contains {name}, a file that is not plain data "
            "(JSON or raw tensor bytes): it could run code when read, so it is refused, not "
            "loaded. rb_lightning never writes such a file; the checkpoint was made elsewhere "
            "or tampered with. Resume from a checkpoint you trust."
        )


def _dump_components(replay_buffer: ReplayBuffer, root: Path, digests: _Digests) -> dict[str, Any]:
    """Sampler, writer (their own ``dumps``: JSON and memmaps) and generator state."""
    replay_buffer.sampler.dumps(root / "sampler")
    replay_buffer.writer.dumps(root / "writer")
    generator = torchrl_compat.buffer_generator(replay_buffer)
    if generator is not None:
        state = TensorDict(rng_state=generator.get_state(), device=generator.device)
        digests.add_written(state.memmap(root / "rng_state"))
    return {
        "batch_size": torchrl_compat.default_batch_size(replay_buffer),
        "consume_after_n_samples": torchrl_compat.consume_after_n_samples(replay_buffer),
    }


def _load_components(
    replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any], *, sampler: bool = True
) -> None:
    """Inverse of :func:`_dump_components` (after the storage was restored)."""
    part = "sampler"
    try:
        if sampler:
            replay_buffer.sampler.loads(root / "sampler")
        part = "writer"
        replay_buffer.writer.loads(root / "writer")
    except Exception as error:
        raise BufferCheckpointError(
            f"Could not load the {part} state saved in {root / part} into the DataModule's "
            f"buffer's {type(getattr(replay_buffer, part)).__name__} ({type(error).__name__}: "
            f"{error}). {_cause_beyond_build(manifest)}"
        ) from error
    if (root / "rng_state").exists():
        state = TensorDict.load_memmap(root / "rng_state", allow_pickle=False)
        generator = torch.Generator(device=state.device)
        # The state of a CUDA generator is a host byte tensor; load_memmap put it on the
        # generator's device (recorded in the dump), set_state wants it on the host.
        generator.set_state(state["rng_state"].cpu().clone())
        replay_buffer.set_rng(generator)
    if manifest.get("batch_size") is not None:
        torchrl_compat.set_default_batch_size(replay_buffer, manifest["batch_size"])
    torchrl_compat.set_consume_after_n_samples(
        replay_buffer, manifest.get("consume_after_n_samples")
    )


def _on_host(data: TensorDictBase) -> TensorDictBase:
    """``data`` in host memory: dumps are host files, restored onto the storage's device."""
    device = data.device
    # device None: leaves may sit anywhere (a tensor storage's rows wrapped in a TensorDict).
    return data if device is not None and device.type == "cpu" else data.to("cpu")


def _dump_filled_rows(replay_buffer: ReplayBuffer, root: Path, digests: _Digests) -> dict[str, Any]:
    """Write rows ``[0, len)`` and the sampler/writer/generator state the way ``dumps`` does.

    Tensors and JSON only (no pickles): the rows as a memory-mapped TensorDict,
    the sampler and writer through their own ``dumps``, the generator state as
    a memory-mapped tensor. Returns what the manifest must record to load it.
    """
    storage = replay_buffer.storage
    rows = storage.get(slice(0, len(storage)))
    tensor_rows = isinstance(rows, torch.Tensor)
    if tensor_rows:
        rows = TensorDict({_TENSOR_ROWS: rows}, batch_size=rows.shape[:1])
    rows = _on_host(rows)  # a storage on the GPU is saved to host memory-mapped files
    # memmap storages: copy, do not move
    digests.add_written(rows.memmap(root / "storage", copy_existing=True))
    return {
        "capacity": storage.max_size,
        "tensor_rows": tensor_rows,
        **_dump_components(replay_buffer, root, digests),
    }


def _check_capacity(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    saved = manifest.get("capacity")
    given = replay_buffer.storage.max_size
    if saved is not None and saved != given:
        raise BufferCheckpointError(
            f"The buffer saved in {root} has capacity max_size={saved}, the "
            f"DataModule's buffer has max_size={given}. Build the buffer with the "
            "same storage size as the saved run."
        )


def _load_filled_rows(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    storage = replay_buffer.storage
    _require(isinstance(storage, TensorStorage), root, "a tensor storage", replay_buffer)
    _check_capacity(replay_buffer, root, manifest)
    saved = TensorDict.load_memmap(root / "storage", allow_pickle=False)
    rows = saved[_TENSOR_ROWS] if manifest["tensor_rows"] else saved
    try:
        # empty() resets storage length, writer and sampler; set() initialises a lazy
        # storage at the full capacity and counts the rows; then the saved states.
        replay_buffer.empty()
        with torchrl_compat.overwriting_scratch_files(storage):
            storage.set(slice(0, manifest["len"]), rows)
    except Exception as error:
        raise _unloadable(root, error, replay_buffer, manifest, rows) from error
    _load_components(replay_buffer, root, manifest)


def _unloadable(
    root: Path,
    error: Exception,
    replay_buffer: ReplayBuffer,
    manifest: dict[str, Any],
    saved: Any = None,
) -> BufferCheckpointError:
    """The error for saved items the receiving buffer could not take, naming the cause."""
    head = (
        f"Could not load the replay buffer saved in {root} into the DataModule's buffer "
        f"({type(error).__name__}: {error})."
    )
    storage = replay_buffer.storage
    scratch_dir = getattr(storage, "scratch_dir", None)
    if "already exists" in str(error):
        return BufferCheckpointError(
            f"{head} The storage refused to replace files already in its scratch_dir "
            f"{scratch_dir} (torchrl's existsok=False). Remove them, or give the storage "
            "another scratch_dir."
        )
    if isinstance(error, OSError):
        where = f"its scratch_dir {scratch_dir}" if scratch_dir else "its memory-mapped files"
        return BufferCheckpointError(
            f"{head} The storage could not write the restored items into {where}. Make that "
            "directory writable, with room for max_size items, or point the storage's "
            "scratch_dir at one that is."
        )
    difference = _column_difference(storage, saved)
    if difference is not None:
        return BufferCheckpointError(
            f"{head} The DataModule's buffer already held items when the checkpoint was "
            f"restored (filled by a source or a warm-up), and {difference}. Fill the buffer "
            "with the saved columns, or resume without filling it first."
        )
    return BufferCheckpointError(f"{head} {_cause_beyond_build(manifest)}")


def _cause_beyond_build(manifest: dict[str, Any]) -> str:
    """What to say when loading failed and the buffers' builds were compared (or not)."""
    if not manifest.get("build"):
        return (
            "This dump predates build records, so the buffers could not be compared: build "
            "the buffer as in the saved run (same storage type and max_size, same sampler and "
            "writer types)."
        )
    return (
        "The buffer is built as the saved one (storage type, max_size, sampler and its "
        "settings, writer: all match), so the build is not the cause. Resume from an earlier "
        "checkpoint; if that fails the same way, report it with this message."
    )


def _column_difference(storage: Any, saved: Any) -> str | None:
    """How the saved items' columns differ from those of an already filled storage."""
    content = torchrl_compat.storage_content(storage)
    if not getattr(storage, "initialized", False) or not isinstance(saved, TensorDictBase):
        return None
    if not isinstance(content, TensorDictBase):
        return None

    def columns(data: TensorDictBase) -> dict[str, tuple[Any, ...]]:
        return {
            ".".join(key) if isinstance(key, tuple) else key: (tuple(leaf.shape[1:]), leaf.dtype)
            for key, leaf in data.items(include_nested=True, leaves_only=True)
            if isinstance(leaf, torch.Tensor)
        }

    held, wanted = columns(content), columns(saved)
    if held.keys() != wanted.keys():
        return f"it holds columns {sorted(held)}, the checkpoint {sorted(wanted)}"
    for name, (shape, dtype) in wanted.items():
        if held[name] != (shape, dtype):
            return (
                f"column {name!r} holds {held[name][1]} of shape {list(held[name][0])} per "
                f"item, the checkpoint's {dtype} of shape {list(shape)}"
            )
    return None


def _load_whole_storage(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    """A whole tensor storage (and, for dumps of older versions, torchrl's ``dumps`` layout)."""
    _check_capacity(replay_buffer, root, manifest)
    try:
        # The storage's checkpointer reads memmaps and JSON; _refuse_pickles has made
        # sure there is no pickle sidecar for it to read.
        with torchrl_compat.overwriting_scratch_files(replay_buffer.storage):
            replay_buffer.storage.loads(root / "storage")
    except Exception as error:
        raise _unloadable(root, error, replay_buffer, manifest) from error
    if manifest["kind"] == _TORCHRL_DUMPS and (root / "buffer_metadata.json").exists():
        manifest = {**manifest, **json.loads((root / "buffer_metadata.json").read_text())}
    _load_components(replay_buffer, root, manifest)
    if (root / _TRANSFORM_STATE).exists():
        replay_buffer.transform.load_state_dict(
            torch.load(root / _TRANSFORM_STATE, weights_only=True)
        )


def _dump_list_items(replay_buffer: ReplayBuffer, root: Path, digests: _Digests) -> dict[str, Any]:
    """One memory-mapped TensorDict per ``ListStorage`` item, and the components."""
    storage = replay_buffer.storage
    kinds = []
    for number in range(len(storage)):
        item = storage.get(number)
        if isinstance(item, TensorDictBase):
            kinds.append("tensordict")
        elif isinstance(item, torch.Tensor):
            kinds.append("tensor")
            item = TensorDict({_TENSOR_ROWS: item})
        elif isinstance(item, dict):
            kinds.append("dict")
            item = TensorDict(item)
        else:
            shutil.rmtree(root, ignore_errors=True)
            raise BufferCheckpointError(
                f"ListStorage item {number} is a {type(item).__name__}: rb_lightning "
                "checkpoints TensorDict, tensor and dict items (stored as tensors and JSON, "
                "never pickled). Store items as TensorDicts."
            )
        digests.add_written(item.memmap(root / _LIST_DIR / str(number)))
    return {
        "capacity": storage.max_size,
        "item_kinds": kinds,
        **_dump_components(replay_buffer, root, digests),
    }


def _load_list_items(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    storage = replay_buffer.storage
    _require(isinstance(storage, ListStorage), root, "a ListStorage", replay_buffer)
    _check_capacity(replay_buffer, root, manifest)
    replay_buffer.empty()
    for number, kind in enumerate(manifest["item_kinds"]):
        item = TensorDict.load_memmap(root / _LIST_DIR / str(number), allow_pickle=False)
        item = item.clone()  # out of the memmap files, which belong to the checkpoint
        if kind == "tensor":
            item = item[_TENSOR_ROWS]
        elif kind == "dict":
            item = item.to_dict()
        storage.set(number, item)
    _load_components(replay_buffer, root, manifest)


def _load_tensors_only(path: Path, fix: str) -> Any:
    """``torch.load(weights_only=True)``; anything else in the file is refused, not run."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:
        raise BufferCheckpointError(
            f"{path} was written by an older rb_lightning and holds objects other than "
            f"tensors ({type(error).__name__}): refused, loading it could run code. {fix}"
        ) from error


def _load_legacy_list(replay_buffer: ReplayBuffer, root: Path) -> None:
    # Written by rb_lightning before pickle-free dumps: a torch.save of rb.state_dict().
    _require(isinstance(replay_buffer.storage, ListStorage), root, "a ListStorage", replay_buffer)
    state = _load_tensors_only(
        root / _LEGACY_LIST_STATE,
        "If the checkpoint is your own, load it with the older rb_lightning that wrote it "
        "and save it again.",
    )
    replay_buffer.load_state_dict(state)


def _load_legacy_empty(replay_buffer: ReplayBuffer, root: Path) -> None:
    # Written by rb_lightning before pickle-free dumps; tensors, strings and ints only.
    state = _load_tensors_only(root / _LEGACY_EMPTY_STATE, "Resume from a checkpoint you trust.")
    replay_buffer.empty()
    replay_buffer.writer.load_state_dict(state["writer"])
    if state["rng_state"] is not None:
        generator = torch.Generator(device=state["rng_device"])
        generator.set_state(state["rng_state"])
        replay_buffer.set_rng(generator)


def _require(ok: bool, root: Path, what: str, replay_buffer: ReplayBuffer) -> None:
    if not ok:
        raise BufferCheckpointError(
            f"The buffer saved in {root} needs {what}, but the DataModule's buffer uses "
            f"{type(replay_buffer.storage).__name__}. Build the buffer as in the saved run."
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


# -- atomic versions ---------------------------------------------------------------------------
def sync_path(path: str | os.PathLike, *, recursive: bool = True) -> None:
    """``fsync`` ``path``: a file, or a directory with (``recursive``) everything under it.

    A rename makes a dump visible; without this, a machine that crashes right after
    could keep the rename and lose the data behind it. Directories are synced too,
    so that the entries of new files survive the crash as well.
    """
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

    ``dump(path)`` writes the dump into ``path`` (it must not exist yet) and
    returns its manifest. It runs on ``<version>.tmp``, which is flushed to disk
    (:func:`sync_path`) and renamed to ``<version>`` once complete (one
    ``os.replace`` on the same filesystem, then ``directory`` is synced), so a
    reader never finds a half-written version, after a killed process or a
    crashed machine; a failed dump is removed at once so it does not hold the space. torchrl's ``Checkpoint.save`` stages and
    renames too, but replaces a fixed path; versions here are new names, so an
    older version stays readable until its ``.ckpt`` is replaced.

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
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
    """Move a complete dump ``staged`` (written elsewhere) to ``directory/<version>``.

    One rename on the same filesystem; across filesystems a copy under
    ``<version>.tmp`` first (synced), then the rename, so the version appears
    complete or not at all. ``staged`` must already be synced (:func:`sync_path`).
    """
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


def remove_stale_versions(directory: str | os.PathLike) -> list[Path]:
    """Remove ``<version>.tmp`` directories under ``directory``; return what was removed.

    A version is staged under ``.tmp`` and renamed once complete, so a ``.tmp``
    that exists when a new save starts belongs to a save that died (killed, out
    of disk) and only takes the space the new one needs. Saves of one run do
    not overlap, so this never races a live write of the same run.
    """
    removed = []
    for entry in Path(directory).glob("*.tmp"):
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


# -- Ray-served buffers -------------------------------------------------------------------------
def dump_remote_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> dict[str, Any]:
    """Have a Ray buffer's actor write its content to the new directory ``path``; return the manifest.

    The actor writes with torchrl's ``dumps`` (memmaps and JSON; the one pickle it
    writes, an empty prefetch state, holds plain values only and is checked as
    such), in one actor call, so a collector's writes land before or after it.
    ``path`` must be reachable from the actor's process (same machine or a shared
    filesystem). The manifest is written by this process afterwards.
    """
    from rb_lightning.ray import dump_in_actor

    root = Path(path).absolute()
    build = buffer_build(replay_buffer)
    length, write_count = dump_in_actor(replay_buffer, str(root))
    if not root.is_dir():
        raise BufferCheckpointError(
            f"The Ray replay buffer's actor wrote its checkpoint to {root}, and this process "
            "does not see it there: the actor runs on another machine. Save checkpoints to "
            "a filesystem that the actor's node and the rank-0 trainer share "
            "(ModelCheckpoint(dirpath=...) on a shared mount), or run the actor on the "
            "rank-0 node (named_actor_config(..., resources=...))."
        )
    _refuse_pickles(root, written=True)
    return _write_manifest(
        root,
        {
            "kind": _TORCHRL_DUMPS if length else _REMOTE_EMPTY,
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
    """Replace a Ray buffer's content, in its actor, with a :func:`dump_remote_buffer` directory.

    Verified here first (manifest, no file that could run code, same build); the
    actor then reads it with torchrl's ``loads``, so ``path`` must be reachable from
    the actor's process.
    """
    from rb_lightning.ray import load_in_actor

    root = Path(path).absolute()
    manifest = read_manifest(root, verify=verify)
    if manifest["kind"] not in (_TORCHRL_DUMPS, _REMOTE_EMPTY):
        raise BufferCheckpointError(
            f"The checkpoint's replay buffer ({root}) was saved from a buffer in the training "
            "process, and the DataModule now holds a Ray buffer (service_backend='ray'). "
            "Resume with the same kind of buffer as the saved run, or start a new run."
        )
    _refuse_pickles(root)
    check_same_build(manifest.get("build"), replay_buffer, root)
    empty = manifest["kind"] == _REMOTE_EMPTY
    length, write_count = load_in_actor(replay_buffer, None if empty else str(root))
    if length != manifest["len"] or (not empty and write_count != manifest["write_count"]):
        raise BufferCheckpointError(
            f"The Ray replay buffer restored from {root} holds {length} items (write_count "
            f"{write_count}), its manifest says {manifest['len']} ({manifest['write_count']})."
        )


# -- torchrl.checkpoint ------------------------------------------------------------------------
class BufferCheckpointAdapter(CheckpointAdapter):
    """Store a replay buffer in a ``torchrl.checkpoint.Checkpoint`` in this format.

    torchrl 0.14's ``Checkpoint`` saves a ``ReplayBuffer`` through its ``dumps``
    (its default adapter), which writes a pickle and, in 0.14.1, restores string
    columns wrongly. Registered for ``ReplayBuffer``, this adapter writes the
    component with :func:`dump_buffer` instead (verified, pickle-free, strings
    kept), so torchrl's manifest, archive format and ``CheckpointRotation``
    apply to it.

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.checkpoint import Checkpoint
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict({"s": ["a", "b"]}, batch_size=[2]))
        >>> path = f"{tempfile.mkdtemp()}/ckpt"
        >>> _ = Checkpoint(buffer=rb).register_adapter(ReplayBuffer, BufferCheckpointAdapter()).save(path)
        >>> restored = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> checkpoint = Checkpoint(buffer=restored).register_adapter(ReplayBuffer, BufferCheckpointAdapter())
        >>> checkpoint.load(path).loaded, list(restored[:2]["s"])
        ({'buffer'}, ['a', 'b'])
    """

    adapter_id = "rb_lightning.buffer"
    format_version = FORMAT_VERSION

    def save(
        self, component: Any, path: Path, *, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """Dump ``component`` (a ``ReplayBuffer``) into ``path``; ``kwargs`` go to :func:`dump_buffer`."""
        del args
        # torchrl's Checkpoint hands over a path that does not exist yet; dump_buffer creates it.
        return dump_buffer(component, path, **kwargs)["len"]

    def load(
        self,
        component: Any,
        path: Path,
        *,
        map_location: Any,
        tensor_load_kwargs: Mapping[str, Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Any:
        """Restore ``component`` from ``path``; returns the pending batches, if any were saved."""
        del map_location, tensor_load_kwargs, args, kwargs
        pending = load_buffer(component, path)
        return pending or None


def _tensor_leaves(data: Any) -> Iterator[torch.Tensor]:
    """The tensors inside nested dicts, lists and tuples (a storage of plain containers)."""
    if isinstance(data, torch.Tensor):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from _tensor_leaves(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from _tensor_leaves(value)
