"""Chunked buffer saves: each save writes the rows written since the previous one.

Between two saves a round-robin writer changes rows ``[cursor, cursor + n) mod capacity``.
A chunked save writes those rows as new *chunks* in a store shared by every checkpoint of
a directory (``<dir>/buffer-chunks/<chunk>/``), plus the small state and a manifest
(layout ``chunked_rows``) whose *segments* map storage rows to chunk rows, with each
chunk file's size and ``xxh3_64`` checksum. :func:`prepare_chunked_save` copies the rows
in the training thread; :meth:`ChunkedSave.finish` writes and renames in any thread;
:func:`collect_garbage` deletes chunks no kept manifest lists.

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.persist.dumps import load_dump
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(8)}, batch_size=[8]))
    >>> checkpoints = Path(tempfile.mkdtemp())
    >>> first = prepare_chunked_save(rb, checkpoints / "a.ckpt.buffer").finish()[1]
    >>> _ = rb.extend(TensorDict({"x": torch.arange(100, 103)}, batch_size=[3]))
    >>> second = prepare_chunked_save(rb, checkpoints / "b.ckpt.buffer").finish()[1]
    >>> first["changed_rows"], second["changed_rows"]
    (8, 3)
    >>> restored = ReplayBuffer(storage=LazyTensorStorage(8))
    >>> _ = load_dump(restored, next((checkpoints / "b.ckpt.buffer").iterdir()))
    >>> restored[:]["x"].tolist()
    [100, 101, 102, 3, 4, 5, 6, 7]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import uuid
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    TensorStorage,
)
from torchrl.data.replay_buffers.writers import RoundRobinWriter, TensorDictRoundRobinWriter

from rb_lightning import torchrl_compat
from rb_lightning.persist.build import buffer_build
from rb_lightning.persist.components import (
    dump_components,
    dump_pending_batches,
    load_components,
    on_host,
)
from rb_lightning.persist.files import check_disk_space, in_use, is_in_use, sync_path
from rb_lightning.persist.manifest import (
    CHECKSUMS,
    CHUNKS_DIR,
    MANIFEST,
    TENSOR_ROWS,
    Digests,
    Layout,
    check_plain_files,
    file_digest,
    write_manifest,
)
from rb_lightning.persist.mismatch import unloadable

__all__ = [
    "ChunkedSave",
    "Segment",
    "chunk_store_of",
    "chunked_save_supported",
    "collect_garbage",
    "load_chunked_rows",
    "prepare_chunked_save",
]

#: The layout a chunked save's manifest records (:mod:`rb_lightning.persist.layouts`).
_LAYOUT: Layout = "chunked_rows"
#: A first (full) save is cut into chunks of at most ``capacity / _PIECES`` rows, so that a
#: chunk of it is freed once the writer has passed it, not after a whole lap; but of at
#: least ``_PIECE_MIN_BYTES`` (each chunk costs a few files and milliseconds to load).
_PIECES = 64
_PIECE_MIN_BYTES = 4 * 1024**2
#: Changed rows up to this fraction of the capacity (or up to ``_COPY_MIN_BYTES``) are
#: copied into memory in the training thread and written later; more are written to their
#: chunk files at once (no second copy of most of the buffer in memory).
_COPY_MAX_FRACTION = 0.25
_COPY_MIN_BYTES = 64 * 1024**2
_STORAGES = (TensorStorage, LazyTensorStorage, LazyMemmapStorage)
_WRITERS = (RoundRobinWriter, TensorDictRoundRobinWriter)


@dataclass(frozen=True)
class Segment:
    """Storage rows ``[start, stop)`` are rows ``[offset, offset + stop - start)`` of ``chunk``."""

    start: int
    stop: int
    chunk: str
    offset: int

    def to_json(self) -> list[Any]:
        return [self.start, self.stop, self.chunk, self.offset]


def overlay(segments: Iterable[Segment], new: Sequence[Segment]) -> list[Segment]:
    """``segments`` with the rows ``new`` covers taken from ``new``, sorted by ``start``.

    Examples:
        >>> old = [Segment(0, 10, "a", 0)]
        >>> [s.to_json() for s in overlay(old, [Segment(4, 6, "b", 0)])]
        [[0, 4, 'a', 0], [4, 6, 'b', 0], [6, 10, 'a', 6]]
    """
    result = list(new)
    for segment in segments:
        pieces = [(segment.start, segment.stop)]
        for cover in new:
            kept = []
            for start, stop in pieces:
                if cover.stop <= start or cover.start >= stop:
                    kept.append((start, stop))
                    continue
                if start < cover.start:
                    kept.append((start, cover.start))
                if cover.stop < stop:
                    kept.append((cover.stop, stop))
            pieces = kept
        result += [
            Segment(start, stop, segment.chunk, segment.offset + start - segment.start)
            for start, stop in pieces
        ]
    return sorted(result, key=lambda s: s.start)


@dataclass(frozen=True)
class _Base:
    """A buffer's last complete chunked save: what its next save writes the changes against."""

    store: Path
    capacity: int
    cursor: int
    write_count: int
    length: int
    segments: tuple[Segment, ...]
    chunks: dict[str, dict[str, Any]]  # chunk -> {"files": {name: size}, "xxh3_64": {...}}


# The last save of each live buffer, by buffer: read by the next save and by the garbage
# collection (whose chunks it must keep). A buffer that is gone releases its entry.
_BASES: weakref.WeakKeyDictionary[Any, _Base] = weakref.WeakKeyDictionary()
_BASES_LOCK = threading.Lock()


def chunk_store_of(version_dir: str | os.PathLike) -> Path:
    """The chunk store of a version directory ``<dir>/<ckpt>.buffer/<version>``: ``<dir>/buffer-chunks``."""
    return Path(version_dir).parent.parent / CHUNKS_DIR


def chunked_save_supported(replay_buffer: ReplayBuffer) -> bool:
    """Whether ``replay_buffer`` can be saved in chunks: a 1-D tensor storage with a ``RoundRobinWriter``, torchrl's default checkpointer, no prefetch, no stateful transform."""
    storage = replay_buffer.storage
    if type(storage) not in _STORAGES or not storage.initialized:
        return False
    return (
        type(replay_buffer.writer) in _WRITERS
        and getattr(storage, "ndim", 1) == 1
        and len(storage) > 0
        and isinstance(torchrl_compat.storage_content(storage), (TensorDictBase, torch.Tensor))
        and not torchrl_compat.has_custom_checkpointer_hooks(storage)
        and not torchrl_compat.has_prefetch(replay_buffer)
        and not replay_buffer.transform.state_dict()
    )


def _usable_base(replay_buffer: ReplayBuffer, store: Path) -> _Base | None:
    """The buffer's last save if the rows since then are known and its chunks are on disk."""
    with _BASES_LOCK:
        base = _BASES.get(replay_buffer)
    if base is None or base.store != store:
        return None
    storage = replay_buffer.storage
    capacity = storage.max_size
    written = int(torchrl_compat.write_count(replay_buffer) or 0) - base.write_count
    if base.capacity != capacity or written < 0 or written >= capacity:
        return None
    # Consistent with writes through the writer only (an emptied buffer, a writer moved
    # by hand, or rows set another way would not be): otherwise a full save.
    if torchrl_compat.write_cursor(replay_buffer) != (base.cursor + written) % capacity:
        return None
    if len(storage) != min(capacity, base.length + written):
        return None
    if not all((store / chunk).is_dir() for chunk in base.chunks):
        return None
    return base


def _ring_ranges(cursor: int, count: int, capacity: int) -> list[tuple[int, int]]:
    """Rows ``[cursor, cursor + count) mod capacity`` as at most two ranges."""
    if count == 0:
        return []
    if cursor + count <= capacity:
        return [(cursor, cursor + count)]
    return [(cursor, capacity), (0, cursor + count - capacity)]


def _full_ranges(length: int, capacity: int, row_bytes: int) -> list[tuple[int, int]]:
    step = max(1, -(-capacity // _PIECES), -(-_PIECE_MIN_BYTES // max(1, row_bytes)))
    return [(start, min(start + step, length)) for start in range(0, length, step)]


class ChunkedSave:
    """A chunked save prepared in the training thread; :meth:`finish` completes it anywhere."""

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        directory: Path,
        version: str,
        staging: Path,
        digests: Digests,
        content: dict[str, Any],
        base: _Base | None,
        segments: list[Segment],
        in_memory: list[tuple[str, TensorDictBase]],
        on_disk: dict[str, dict[str, Any]],
        store: Path,
        marks: contextlib.ExitStack,
    ) -> None:
        self.replay_buffer, self.directory, self.version = replay_buffer, directory, version
        self.staging, self.digests, self.content = staging, digests, content
        self.base, self.segments = base, segments
        self._in_memory, self._on_disk = in_memory, on_disk
        self.store = store
        self._marks = marks  # this save's staged paths, kept from other cleanups until it ends

    def finish(self) -> tuple[str, dict[str, Any]]:
        """Write the chunks and the manifest, ``fsync``, rename the version; return it and its manifest.

        Safe in another thread: it reads only :func:`prepare_chunked_save`'s copies. On failure
        nothing is published and the next save builds on the previous one.
        """
        records = dict(self._on_disk)
        try:
            for chunk, rows in self._in_memory:
                records[chunk] = _write_chunk(self.store, chunk, rows)
            self._in_memory = []  # the copies are on disk: release them
            for chunk in records:
                sync_path(self.store / f"{chunk}.tmp")
                os.replace(self.store / f"{chunk}.tmp", self.store / chunk)
            sync_path(self.store, recursive=False)
            used = {segment.chunk for segment in self.segments}
            old = self.base.chunks if self.base is not None else {}
            chunks = {name: old[name] for name in sorted(used) if name in old}
            chunks.update({name: record for name, record in records.items() if name in used})
            manifest = write_manifest(
                self.staging,
                {
                    **self.content,
                    "segments": [s.to_json() for s in self.segments],
                    "chunks": chunks,
                },
                self.digests,
            )
            sync_path(self.staging)
            os.replace(self.staging, self.directory / self.version)
            sync_path(self.directory, recursive=False)
        except BaseException:
            shutil.rmtree(self.staging, ignore_errors=True)
            for chunk in records:
                shutil.rmtree(self.store / f"{chunk}.tmp", ignore_errors=True)
            self._marks.close()
            raise
        storage = self.replay_buffer.storage
        with _BASES_LOCK:
            _BASES[self.replay_buffer] = _Base(
                store=self.store,
                capacity=storage.max_size,
                cursor=int(self.content["cursor"]),
                write_count=int(self.content["write_count"]),
                length=int(self.content["len"]),
                segments=tuple(self.segments),
                chunks=chunks,
            )
        self._marks.close()  # the new chunks are the buffer's base now, kept as such
        return self.version, manifest

    def abandon(self) -> None:
        """Remove what :func:`prepare_chunked_save` staged (a save that will not be finished)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        for chunk in self._on_disk:
            shutil.rmtree(self.store / f"{chunk}.tmp", ignore_errors=True)
        self._marks.close()


def _write_chunk(store: Path, chunk: str, rows: TensorDictBase) -> dict[str, Any]:
    """Write ``rows`` to ``store/<chunk>.tmp``; return its files' sizes and checksums."""
    root = store / f"{chunk}.tmp"
    digests = Digests(root)
    digests.add_written(rows.memmap(root, copy_existing=True))
    check_plain_files(root, written=True)
    files = {
        path.relative_to(root).as_posix(): path.stat().st_size
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
    return {
        "files": files,
        CHECKSUMS: {name: digests.get(name) or file_digest(root / name) for name in files},
    }


def prepare_chunked_save(
    replay_buffer: ReplayBuffer,
    directory: str | os.PathLike,
    *,
    pending_batches: Sequence[Any] = (),
    extra: dict[str, Any] | None = None,
) -> ChunkedSave:
    """Copy what changed since the buffer's last chunked save into ``directory``; the rest is :meth:`ChunkedSave.finish`.

    ``directory``: ``<dir>/<ckpt>.buffer``; chunks go to ``<dir>/buffer-chunks``. Without a
    trusted previous save every row is copied. The small state is written here, so the
    buffer may change as soon as this returns.
    """
    with torchrl_compat.writes_held(replay_buffer):
        return _prepare_chunked_save(
            replay_buffer, directory, pending_batches=pending_batches, extra=extra
        )


def _prepare_chunked_save(
    replay_buffer: ReplayBuffer,
    directory: str | os.PathLike,
    *,
    pending_batches: Sequence[Any],
    extra: dict[str, Any] | None,
) -> ChunkedSave:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    store = (directory.parent / CHUNKS_DIR).resolve()
    store.mkdir(exist_ok=True)
    storage = replay_buffer.storage
    capacity, length = storage.max_size, len(storage)
    write_count = int(torchrl_compat.write_count(replay_buffer) or 0)
    base = _usable_base(replay_buffer, store)
    row_bytes = _row_bytes(storage)
    if base is None:
        ranges = _full_ranges(length, capacity, row_bytes)
    else:
        ranges = _ring_ranges(base.cursor, write_count - base.write_count, capacity)
    changed = sum(stop - start for start, stop in ranges)
    # The changed rows, a prioritized sampler's two trees (2 x 8 bytes a slot), read-ahead.
    sampler = getattr(replay_buffer, "sampler", None)
    small = 16 * int(torchrl_compat.sampler_attribute(sampler, "max_capacity") or 0)
    small += sum(int(b.bytes()) for b in pending_batches if isinstance(b, TensorDictBase))
    check_disk_space(store, changed * row_bytes + small, inline=False)

    version = uuid.uuid4().hex
    staging = directory / f"{version}.tmp"
    names = [uuid.uuid4().hex for _ in ranges]
    marks = contextlib.ExitStack()
    marks.enter_context(
        in_use([staging, *(store / f"{c}.tmp" for c in names), *(store / c for c in names)])
    )
    digests = Digests(staging)
    in_memory: list[tuple[str, TensorDictBase]] = []
    on_disk: dict[str, dict[str, Any]] = {}
    try:
        staging.mkdir()
        components = dump_components(replay_buffer, staging, digests)
        dump_pending_batches(pending_batches, staging, digests)
        check_plain_files(staging, written=True)
        copy = changed <= _COPY_MAX_FRACTION * capacity or changed * row_bytes <= _COPY_MIN_BYTES
        new: list[Segment] = []
        tensor_rows = isinstance(torchrl_compat.storage_content(storage), torch.Tensor)
        for (start, stop), chunk in zip(ranges, names, strict=True):
            rows = storage.get(slice(start, stop))
            if tensor_rows:
                rows = TensorDict({TENSOR_ROWS: rows}, batch_size=rows.shape[:1])
            rows = on_host(rows)
            if copy:  # the training thread's whole cost: one copy of the changed rows
                in_memory.append((chunk, rows.clone()))
            else:
                on_disk[chunk] = _write_chunk(store, chunk, rows)
            new.append(Segment(start, stop, chunk, 0))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for chunk in on_disk:
            shutil.rmtree(store / f"{chunk}.tmp", ignore_errors=True)
        marks.close()
        raise
    content = {
        **(extra or {}),
        **components,
        "layout": _LAYOUT,
        "len": length,
        "write_count": write_count,
        "cursor": torchrl_compat.write_cursor(replay_buffer),
        "pending_batches": len(pending_batches),
        "build": buffer_build(replay_buffer),
        "capacity": capacity,
        "tensor_rows": tensor_rows,
        "chunk_store": CHUNKS_DIR,
        "changed_rows": changed,
        "changed_bytes": changed * row_bytes,
    }
    segments = overlay(base.segments if base is not None else (), new)
    return ChunkedSave(
        replay_buffer, directory, version, staging, digests, content, base, segments,
        in_memory, on_disk, store, marks,
    )  # fmt: skip


def _row_bytes(storage: Any) -> int:
    content = torchrl_compat.storage_content(storage)
    if isinstance(content, torch.Tensor):
        total = content.numel() * content.element_size()
    else:
        total = int(content.bytes())
    return -(-total // max(1, storage.max_size))


def check_chunk_files(root: Path, manifest: dict[str, Any]) -> None:
    """Raise unless every chunk ``manifest`` lists holds plain data only (JSON, memmaps)."""
    store = chunk_store_of(root)
    for chunk in manifest.get("chunks", {}):
        check_plain_files(store / chunk)


def load_chunked_rows(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    """Replace ``replay_buffer``'s content with a chunked save (verified already); its next save writes only newer rows."""
    storage = replay_buffer.storage
    store = chunk_store_of(root)
    opened: dict[str, TensorDictBase] = {}
    layout: dict[tuple[str, ...], tuple[torch.dtype, torch.Size]] | None = None
    rows: Any = None
    try:
        replay_buffer.empty()
        with torchrl_compat.overwriting_scratch_files(storage):
            for start, stop, chunk, offset in manifest["segments"]:
                if chunk not in opened:
                    if layout is None:
                        opened[chunk] = TensorDict.load_memmap(store / chunk, allow_pickle=False)
                        layout = _tensor_layout(opened[chunk])
                    else:
                        opened[chunk] = _open_chunk(store / chunk, layout)
                rows = opened[chunk][offset : offset + stop - start]
                if manifest["tensor_rows"]:
                    rows = rows[TENSOR_ROWS]
                storage.set(slice(start, stop), rows)
    except Exception as error:
        raise unloadable(root, error, replay_buffer, rows) from error
    load_components(replay_buffer, root, manifest)
    with _BASES_LOCK:
        _BASES[replay_buffer] = _Base(
            store=store.resolve(),
            capacity=int(manifest["capacity"]),
            cursor=int(manifest["cursor"]),
            write_count=int(manifest["write_count"]),
            length=int(manifest["len"]),
            segments=tuple(Segment(*segment) for segment in manifest["segments"]),
            chunks=dict(manifest["chunks"]),
        )


def _tensor_layout(
    rows: TensorDictBase,
) -> dict[tuple[str, ...], tuple[torch.dtype, torch.Size]] | None:
    """Key -> (dtype, shape of one row) of a chunk whose leaves are all tensors, else ``None``."""
    layout = {}
    for key, leaf in rows.items(include_nested=True, leaves_only=True):
        if type(leaf).__name__ not in ("MemoryMappedTensor", "Tensor"):
            return None  # strings and other non-tensor data: read through TensorDict
        parts = (key,) if isinstance(key, str) else tuple(key)
        layout[parts] = (leaf.dtype, leaf.shape[1:])
    return layout


def _open_chunk(
    root: Path, layout: dict[tuple[str, ...], tuple[torch.dtype, torch.Size]] | None
) -> TensorDictBase:
    """A chunk's rows mapped from its files (verified already); after the first chunk the ``.memmap`` files are mapped straight (reading each one's JSON metadata cost more than copying)."""
    if layout is None:
        return TensorDict.load_memmap(root, allow_pickle=False)
    leaves = {}
    length = None
    for parts, (dtype, row_shape) in layout.items():
        path = root.joinpath(*parts[:-1], f"{parts[-1]}.memmap")
        row_numel = max(1, row_shape.numel())
        numel = path.stat().st_size // (row_numel * dtype.itemsize)
        tensor = torch.from_file(str(path), shared=False, size=numel * row_numel, dtype=dtype)
        leaves[parts] = tensor.view(numel, *row_shape)
        length = numel if length is None else min(length, numel)
    rows = TensorDict(batch_size=[length or 0])
    for parts, tensor in leaves.items():
        rows.set(parts if len(parts) > 1 else parts[0], tensor)
    return rows


def collect_garbage(store: str | os.PathLike, version_dirs: Iterable[Path]) -> list[str]:
    """Delete the chunks of ``store`` that no manifest of ``version_dirs`` and no live buffer uses.

    This process's saves under way are kept, another process's are not: call it only while
    no other process saves into ``store``. An unreadable manifest deletes nothing. Returns
    the names deleted.
    """
    store = Path(store)
    if not store.is_dir():
        return []
    used: set[str] = set()
    for version in version_dirs:
        if version.name.endswith(".tmp") or not (version / MANIFEST).is_file():
            continue
        try:
            manifest = json.loads((version / MANIFEST).read_text())
        except (OSError, ValueError):
            return []
        used.update(manifest.get("chunks", {}))
    resolved = store.resolve()
    with _BASES_LOCK:
        for base in list(_BASES.values()):
            if base.store == resolved:
                used.update(base.chunks)
    deleted = []
    for entry in sorted(store.iterdir()):
        if entry.name not in used and not is_in_use(entry):  # not a live save's
            shutil.rmtree(entry, ignore_errors=True)
            deleted.append(entry.name)
    if deleted:
        sync_path(store, recursive=False)
    return deleted
