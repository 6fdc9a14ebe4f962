"""Replay-buffer state in Lightning checkpoints: inside the ``.ckpt`` or in a directory beside it.

A resumed online RL / RLHF run needs its buffer back exactly: content, writer
cursor and ``write_count``, sampler state (priorities, the without-replacement
permutation) and the sampling generator.

Checkpoints are sized by content, not capacity: a tensor storage that has not
wrapped yet (``len < max_size``) writes only its filled rows (memory-mapped),
next to its sampler's and writer's own ``dumps`` and the generator state, and
is restored into a buffer of the saved capacity. A wrapped (full) buffer is
written whole by its storage's own checkpointer. A ``ListStorage`` is written
as one memory-mapped TensorDict per item.

No pickle is written or read: dumps hold raw tensor bytes (``.memmap``) and
JSON only, and a dump holding any other file (a pickle sidecar planted in a
checkpoint from elsewhere) is refused before anything is read, so loading a
checkpoint never runs code, also when Lightning loads with
``weights_only=True``.

Before a dump is written, the free space of the target filesystem is checked
against the bytes it needs (:class:`NotEnoughDiskSpaceError` instead of a
``SIGBUS`` in the middle of a memory-mapped write); ``.tmp`` versions left by
an earlier save that died are removed at the next save.

Where it goes is a size policy (:data:`DEFAULT_INLINE_MAX_BYTES`):

* small buffers: the dump directory is packed (uncompressed tar) into a
  ``uint8`` tensor stored in the ``.ckpt`` itself;
* large buffers: the dump is written to ``<ckpt>.buffer/<version>/`` by
  :class:`BufferCheckpointIO`, and the ``.ckpt`` only holds a reference. The
  version directory is written under a temporary name and renamed when
  complete, before the ``.ckpt`` is written, so a crash never leaves a
  checkpoint that points at a half-written buffer. It is removed together with
  its checkpoint (``save_top_k`` rotation goes through ``remove_checkpoint``).

Every dump carries a ``manifest.json`` (item count, ``write_count``, file sizes
and checksums of the small files) that is verified on load: a missing or
damaged buffer raises :class:`BufferCheckpointError` naming the path, never a
silently empty buffer.

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.checkpoint import dump_buffer, load_buffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = dump_buffer(rb, f"{tmp}/buf")
    ...     restored = ReplayBuffer(storage=LazyTensorStorage(10))
    ...     _ = load_buffer(restored, f"{tmp}/buf")
    >>> restored[:]["x"].tolist(), restored.writer._write_count
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import tarfile
import tempfile
import threading
import uuid
import warnings
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from tensordict import TensorDict, TensorDictBase, is_non_tensor
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    TensorStorage,
)

from rb_lightning._sharding import is_remote

#: Buffers whose storage holds at most this many bytes go inside the ``.ckpt``;
#: larger ones are written beside it. ``ReplayBufferDataModule(checkpoint_inline_max_bytes=...)``
#: overrides it (``0``: always beside).
DEFAULT_INLINE_MAX_BYTES = 64 * 1024**2

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
BUFFER_DIR_SUFFIX = ".buffer"
_PENDING = "pending_batches"
_RANK_PREFIX = "rank"  # <version>/rank<r>: one dump per DDP rank
_STAGING_DIR = ".rb_lightning-staging"
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
# Files up to this size get a content checksum; larger ones (the memmapped data) are
# checked by size only, so verification does not re-read gigabytes on every load.
_CHECKSUM_MAX_BYTES = 1024**2


class BufferCheckpointError(RuntimeError):
    """A checkpointed replay buffer is missing, incomplete or does not match its manifest."""


class NotEnoughDiskSpaceError(BufferCheckpointError):
    """The filesystem a buffer dump goes to has less free space than the dump needs."""


# -- sizes and RNG -----------------------------------------------------------------------------
def buffer_nbytes(replay_buffer: ReplayBuffer) -> int:
    """Bytes a dump of ``replay_buffer``'s storage would take (its allocated capacity)."""
    storage = replay_buffer.storage
    if isinstance(storage, TensorStorage):
        data = storage._storage if storage.initialized else None
        if data is None:
            return 0
        if isinstance(data, torch.Tensor):
            return data.numel() * data.element_size()
        if isinstance(data, TensorDictBase):
            return int(data.bytes())
        return sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(data))
    total = 0
    for item in getattr(storage, "_storage", []):
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
    checkpointer = storage.checkpointer
    return (
        getattr(storage, "ndim", 1) == 1
        and 0 < len(storage) < storage.max_size
        and isinstance(storage._storage, (TensorDictBase, torch.Tensor))
        and type(checkpointer) is TensorStorageCheckpointer
        and not checkpointer._save_hooks
        and not checkpointer._load_hooks
        and not getattr(replay_buffer, "_prefetch", False)
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
    nbytes += 16 * int(getattr(sampler, "_max_capacity", 0) or 0)
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
    generator = getattr(replay_buffer, "_rng", None)
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


def _write_manifest(root: Path, content: dict[str, Any]) -> dict[str, Any]:
    files = _files(root)
    content = dict(content)
    content["format"] = FORMAT_VERSION
    content["files"] = files
    content["crc32"] = {
        name: _crc(root / name) for name, size in files.items() if size <= _CHECKSUM_MAX_BYTES
    }
    with open(root / MANIFEST, "w") as file:
        json.dump(content, file)
        file.flush()
        os.fsync(file.fileno())
    return content


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """Read and verify the manifest of a buffer dump; raise :class:`BufferCheckpointError`."""
    root = Path(path)
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
    actual = _files(root)
    for name, size in manifest["files"].items():
        if actual.get(name) != size:
            found = "missing" if name not in actual else f"{actual[name]} bytes"
            raise BufferCheckpointError(
                f"Replay-buffer dump {root} is corrupted: {name} should hold {size} bytes, "
                f"found {found}. Resume from an earlier checkpoint."
            )
    for name, crc in manifest["crc32"].items():
        if _crc(root / name) != crc:
            raise BufferCheckpointError(
                f"Replay-buffer dump {root} is corrupted: checksum mismatch in {name}. Resume "
                "from an earlier checkpoint."
            )
    return manifest


# -- dump / load -------------------------------------------------------------------------------
def dump_buffer(
    replay_buffer: ReplayBuffer,
    path: str | os.PathLike,
    *,
    pending_batches: Sequence[Any] = (),
    extra: dict[str, Any] | None = None,
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
    """
    root = Path(path)
    root.mkdir(parents=True)
    storage = replay_buffer.storage
    extra = dict(extra or {})
    if isinstance(storage, ListStorage):
        kind = _LIST_ITEMS
        extra.update(_dump_list_items(replay_buffer, root))
    elif not getattr(storage, "initialized", True) or len(replay_buffer) == 0:
        # torchrl refuses to dump a storage that never received data.
        kind = _EMPTY
        _dump_components(replay_buffer, root)
    elif writes_filled_rows_only(replay_buffer):
        kind = _FILLED_ROWS
        extra.update(_dump_filled_rows(replay_buffer, root))
    else:
        kind = _WHOLE_STORAGE
        with warnings.catch_warnings():
            # torchrl 0.14.1 warns "last_cursor is None ... may not be saved properly" when a
            # storage restored by loads() is saved before its next write. The cursor only
            # shifts the rows of save hooks (torchrl's compressing checkpointers); the default
            # checkpointer writes the storage as it is, so this dump is complete.
            warnings.filterwarnings("ignore", message="last_cursor is None")
            storage.dumps(root / "storage")
        extra.update(capacity=storage.max_size, **_dump_components(replay_buffer, root))
        transform_state = replay_buffer.transform.state_dict()
        if transform_state:
            torch.save(transform_state, root / _TRANSFORM_STATE)  # tensors: weights-only loadable
    for number, batch in enumerate(pending_batches):
        if not isinstance(batch, TensorDictBase):
            raise TypeError(
                f"pending batch {number} is a {type(batch).__name__}; only TensorDict batches "
                "can be saved for an exact resume."
            )
        _on_host(batch).memmap(root / _PENDING / str(number))
    _refuse_pickles(root, written=True)
    return _write_manifest(
        root,
        {
            "kind": kind,
            "len": len(replay_buffer),
            "write_count": _write_count(replay_buffer),
            "pending_batches": len(pending_batches),
            "build": buffer_build(replay_buffer),
            **extra,
        },
    )


def load_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> list[TensorDictBase]:
    """Restore ``replay_buffer`` from a :func:`dump_buffer` directory; return its pending batches.

    The current content of ``replay_buffer`` is replaced. Raises
    :class:`BufferCheckpointError` naming ``path`` when the directory is
    missing, does not match its manifest, or holds a file that could run code
    when read (a pickle): nothing in it is unpickled.
    """
    root = Path(path)
    manifest = read_manifest(root)
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
        _restore_non_tensor_leaves(replay_buffer, root / "storage")
    elif kind == _LEGACY_LIST:
        _load_legacy_list(replay_buffer, root)
    else:
        raise BufferCheckpointError(
            f"The replay-buffer dump {root} is of kind {kind!r}, which this rb_lightning cannot "
            "read; was it written by a newer rb_lightning?"
        )
    if (
        len(replay_buffer) != manifest["len"]
        or _write_count(replay_buffer) != manifest["write_count"]
    ):
        raise BufferCheckpointError(
            f"Replay buffer loaded from {root} holds {len(replay_buffer)} items (write_count "
            f"{_write_count(replay_buffer)}), its manifest says {manifest['len']} "
            f"({manifest['write_count']}). Is the buffer built with the same storage and "
            "max_size as the one that was saved?"
        )
    return [
        TensorDict.load_memmap(root / _PENDING / str(number), allow_pickle=False).clone()
        for number in range(manifest.get("pending_batches", 0))
    ]


#: Sampler settings that change which items are drawn or the weights they carry.
_SAMPLER_SETTINGS = {
    "_alpha": "alpha",
    "_beta": "beta",
    "_eps": "eps",
    "_max_capacity": "max_capacity",
    "drop_last": "drop_last",
    "shuffle": "shuffle",
}


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

        parts = remote_build(replay_buffer, list(_SAMPLER_SETTINGS))
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
            attribute: getattr(sampler, attribute, None) for attribute in _SAMPLER_SETTINGS
        }
    settings = {
        name: attributes[attribute]
        for attribute, name in _SAMPLER_SETTINGS.items()
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
        if file.name == _LEGACY_PREFETCH and _is_empty_prefetch_state(file):
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


def _is_empty_prefetch_state(path: Path) -> bool:
    """Whether ``path`` is torchrl's pickled prefetch state with an empty queue.

    Read with an unpickler that resolves no global name at all, so nothing can be
    called: a pickle that needs one (anything but plain containers and numbers)
    is rejected.
    """

    class _NoGlobals(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"global {module}.{name} refused")

    try:
        with open(path, "rb") as file:
            state = _NoGlobals(file).load()
    except Exception:
        return False
    return state is None or (isinstance(state, dict) and not state.get("queue"))


def _dump_components(replay_buffer: ReplayBuffer, root: Path) -> dict[str, Any]:
    """Sampler, writer (their own ``dumps``: JSON and memmaps) and generator state."""
    replay_buffer.sampler.dumps(root / "sampler")
    replay_buffer.writer.dumps(root / "writer")
    generator = getattr(replay_buffer, "_rng", None)
    if generator is not None:
        TensorDict(rng_state=generator.get_state(), device=generator.device).memmap(
            root / "rng_state"
        )
    return {
        "batch_size": getattr(replay_buffer, "_batch_size", None),
        "consume_after_n_samples": getattr(replay_buffer, "_consume_after_n_samples", None),
    }


def _load_components(
    replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any], *, sampler: bool = True
) -> None:
    """Inverse of :func:`_dump_components` (after the storage was restored)."""
    try:
        if sampler:
            replay_buffer.sampler.loads(root / "sampler")
        replay_buffer.writer.loads(root / "writer")
    except Exception as error:
        raise BufferCheckpointError(
            f"Could not load the sampler/writer state saved in {root} into the DataModule's "
            f"buffer ({type(error).__name__}: {error}). Build the buffer as in the saved run: "
            "same storage type and max_size, same sampler and writer types."
        ) from error
    if (root / "rng_state").exists():
        state = TensorDict.load_memmap(root / "rng_state", allow_pickle=False)
        generator = torch.Generator(device=state.device)
        # The state of a CUDA generator is a host byte tensor; load_memmap put it on the
        # generator's device (recorded in the dump), set_state wants it on the host.
        generator.set_state(state["rng_state"].cpu().clone())
        replay_buffer.set_rng(generator)
    if manifest.get("batch_size") is not None and hasattr(replay_buffer, "_batch_size"):
        replay_buffer._batch_size = manifest["batch_size"]
    if hasattr(replay_buffer, "_consume_after_n_samples"):
        replay_buffer._consume_after_n_samples = manifest.get("consume_after_n_samples")


def _on_host(data: TensorDictBase) -> TensorDictBase:
    """``data`` in host memory: dumps are host files, restored onto the storage's device."""
    device = data.device
    # device None: leaves may sit anywhere (a tensor storage's rows wrapped in a TensorDict).
    return data if device is not None and device.type == "cpu" else data.to("cpu")


def _dump_filled_rows(replay_buffer: ReplayBuffer, root: Path) -> dict[str, Any]:
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
    rows.memmap(root / "storage", copy_existing=True)  # memmap storages: copy, do not move
    return {
        "capacity": storage.max_size,
        "tensor_rows": tensor_rows,
        **_dump_components(replay_buffer, root),
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
        storage.set(slice(0, manifest["len"]), rows)
    except Exception as error:
        raise BufferCheckpointError(
            f"Could not load the replay buffer saved in {root} into the DataModule's buffer "
            f"({type(error).__name__}: {error}). Build the buffer as in the saved run: same "
            "storage type and max_size, same sampler and writer types."
        ) from error
    _load_components(replay_buffer, root, manifest)


def _load_whole_storage(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    """A whole tensor storage (and, for dumps of older versions, torchrl's ``dumps`` layout)."""
    _check_capacity(replay_buffer, root, manifest)
    try:
        # The storage's checkpointer reads memmaps and JSON; _refuse_pickles has made
        # sure there is no pickle sidecar for it to read.
        replay_buffer.storage.loads(root / "storage")
    except Exception as error:
        raise BufferCheckpointError(
            f"Could not load the replay buffer saved in {root} into the DataModule's buffer "
            f"({type(error).__name__}: {error}). Build the buffer as in the saved run: same "
            "storage type and max_size, same sampler and writer types."
        ) from error
    if manifest["kind"] == _TORCHRL_DUMPS and (root / "buffer_metadata.json").exists():
        manifest = {**manifest, **json.loads((root / "buffer_metadata.json").read_text())}
    _load_components(replay_buffer, root, manifest)
    if (root / _TRANSFORM_STATE).exists():
        replay_buffer.transform.load_state_dict(
            torch.load(root / _TRANSFORM_STATE, weights_only=True)
        )


def _dump_list_items(replay_buffer: ReplayBuffer, root: Path) -> dict[str, Any]:
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
        item.memmap(root / _LIST_DIR / str(number))
    return {
        "capacity": storage.max_size,
        "item_kinds": kinds,
        **_dump_components(replay_buffer, root),
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


def _write_count(replay_buffer: ReplayBuffer) -> int | None:
    return getattr(replay_buffer.writer, "_write_count", None)


def _require(ok: bool, root: Path, what: str, replay_buffer: ReplayBuffer) -> None:
    if not ok:
        raise BufferCheckpointError(
            f"The buffer saved in {root} needs {what}, but the DataModule's buffer uses "
            f"{type(replay_buffer.storage).__name__}. Build the buffer as in the saved run."
        )


def _restore_non_tensor_leaves(replay_buffer: ReplayBuffer, storage_dir: Path) -> None:
    # torchrl 0.14 ``loads`` copies tensors only: strings (NonTensorStack) stay as they
    # were in the live buffer. Put the saved ones back.
    data = replay_buffer.storage._storage
    if not isinstance(data, TensorDictBase) or data.is_locked:
        return
    saved = TensorDict.load_memmap(storage_dir, allow_pickle=False)
    for key in saved.keys(include_nested=True):
        value = saved.get(key)
        if is_non_tensor(value):
            data.set(key, value)


# -- inline (inside the .ckpt) -----------------------------------------------------------------
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
        version = uuid.uuid4().hex
        staging = directory / f"{version}.tmp"
        try:
            manifest = dump_buffer(
                self.replay_buffer, staging, pending_batches=self.pending_batches, extra=self.extra
            )
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # a failed dump must not hold the space
            raise
        os.replace(staging, directory / version)
        return _beside_reference(directory, version, manifest)

    def __reduce__(self) -> Any:
        raise BufferCheckpointError(
            "This checkpoint holds a replay buffer too large to store inline, and it is being "
            "saved without rb_lightning's BufferCheckpointIO, which writes it beside the .ckpt. "
            "Save through a Trainer that the ReplayBufferDataModule is attached to (it installs "
            "the plugin), pass Trainer(plugins=[BufferCheckpointIO()]), or raise "
            "ReplayBufferDataModule(checkpoint_inline_max_bytes=...)."
        )


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
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        except BaseException:
            self.ledger.finish(number, written=False)
            raise
        self.ledger.finish(number, written=True)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, **kwargs: Any) -> Any:
        return self.checkpoint_io.load_checkpoint(path, map_location=map_location, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        self.checkpoint_io.teardown()


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

    def load_checkpoint(self, path: Any, map_location: Any | None = None, **kwargs: Any) -> Any:
        checkpoint = self.checkpoint_io.load_checkpoint(path, map_location=map_location, **kwargs)
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


def install_checkpoint_io(trainer: Any) -> None:
    """Wrap ``trainer.strategy.checkpoint_io`` in :class:`BufferCheckpointIO` (idempotent)."""
    strategy = getattr(trainer, "strategy", None)
    if strategy is None or isinstance(strategy.checkpoint_io, BufferCheckpointIO):
        return
    strategy.checkpoint_io = BufferCheckpointIO(strategy.checkpoint_io)


def _find_requests(checkpoint: dict[str, Any]) -> list[tuple[dict[str, Any], str, Any]]:
    found = []
    for value in checkpoint.values():
        if isinstance(value, dict):
            found += [(value, k, v) for k, v in value.items() if isinstance(v, BufferDumpRequest)]
    return found


def _find_references(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for value in checkpoint.values():
        if isinstance(value, dict):
            found += [
                v for v in value.values() if isinstance(v, dict) and v.get("location") == "beside"
            ]
    return found


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
        final = directory / self.version
        try:
            os.replace(self.staged, final)
        except OSError:  # another filesystem: copy under a temporary name, then rename
            copy = directory / f"{self.version}.tmp"
            shutil.copytree(self.staged, copy)
            os.replace(copy, final)
            shutil.rmtree(self.staged, ignore_errors=True)
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
    )


def load_remote_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> None:
    """Replace a Ray buffer's content, in its actor, with a :func:`dump_remote_buffer` directory.

    Verified here first (manifest, no file that could run code, same build); the
    actor then reads it with torchrl's ``loads``, so ``path`` must be reachable from
    the actor's process.
    """
    from rb_lightning.ray import load_in_actor

    root = Path(path).absolute()
    manifest = read_manifest(root)
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
        version = uuid.uuid4().hex
        staging = directory / f"{version}.tmp"
        try:
            manifest = dump_remote_buffer(self.replay_buffer, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.replace(staging, directory / version)
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
            load_remote_buffer(replay_buffer, resolve_reference(state, checkpoint_path))
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
) -> list[TensorDictBase]:
    """Inverse of :func:`buffer_state`; returns the pending batches to hand out first.

    ``rank`` and ``world_size``: of the restoring process. A checkpoint of a DDP
    run holds one buffer per rank; each rank restores its own, and a different
    world size raises :class:`BufferCheckpointError`.
    """
    location = state.get("location")
    if location == "remote":
        return []
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
            return load_buffer(replay_buffer, tmp)
    if location == "beside":
        root = resolve_reference(state, checkpoint_path)
        if "world_size" in state:
            root = root / f"{_RANK_PREFIX}{rank}"
        return load_buffer(replay_buffer, root)
    raise BufferCheckpointError(
        f"Unknown replay-buffer location {location!r} in the checkpoint (expected 'inline' or "
        "'beside'); was it written by a newer rb_lightning?"
    )
