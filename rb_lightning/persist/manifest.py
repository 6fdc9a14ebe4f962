"""The manifest of a buffer dump: what it records, how it is written, read and verified.

``manifest.json`` holds the format version, the dump's :data:`Layout`, ``len`` and
``write_count``, how the buffer was built, and each file's size and ``xxh3_64`` checksum,
taken from the bytes as they are written (:class:`Digests`). :func:`read_manifest` verifies
a dump before anything is loaded; :func:`check_plain_files` refuses a file that could run
code when read. A dump of an earlier, unreleased format is refused with an error saying so.

Examples:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "data.json").write_text("[1, 2]")
    6
    >>> content = {"layout": "empty_buffer", "len": 0, "write_count": 0, "build": {}}
    >>> manifest = write_manifest(root, content, Digests(root))
    >>> read_manifest(root)["files"], sorted(read_manifest(root)[CHECKSUMS])
    ({'data.json': 6}, ['data.json'])
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import xxhash
from tensordict import TensorDictBase

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError, UsageError

__all__ = [
    "CHECKSUMS",
    "CHUNKS_DIR",
    "FORMAT_VERSION",
    "LIST_DIR",
    "MANIFEST",
    "PENDING_DIR",
    "PREFETCH_STATE",
    "STORAGE_DIR",
    "TENSOR_ROWS",
    "TRANSFORM_STATE",
    "VERIFY_MODES",
    "Digests",
    "Layout",
    "Verify",
    "check_plain_files",
    "check_verify_mode",
    "file_digest",
    "not_this_layout",
    "read_manifest",
    "write_manifest",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: Manifest key of the per-file checksums: hex ``xxh3_64`` digests, for every file.
CHECKSUMS = "xxh3_64"
#: What every manifest of this format records (besides ``format`` and the checksums).
_REQUIRED = ("layout", "len", "write_count", "build", "files")

#: How a dump's files hold its items, the manifest's ``"layout"``: one name per
#: :class:`~rb_lightning.persist.layouts.DumpLayout`, written by this process
#: (``list_items``, ``empty_buffer``, ``filled_rows``, ``whole_storage``; ``chunked_rows`` by
#: :mod:`~rb_lightning.persist.chunks`), by a Ray buffer's actor (``torchrl_dumps``,
#: ``remote_empty``) or by a sharded one's (``sharded_ray_dumps``, read by its own plugin).
Layout = Literal[
    "list_items", "empty_buffer", "filled_rows", "whole_storage", "chunked_rows",
    "torchrl_dumps", "remote_empty", "sharded_ray_dumps",
]  # fmt: skip

# The files of a dump directory.
STORAGE_DIR = "storage"  # a tensor storage's rows, or its checkpointer's files
LIST_DIR = "items"  # a ListStorage: one memmapped TensorDict per item
PENDING_DIR = "pending_batches"  # batches read ahead of the saved step
TENSOR_ROWS = "_rows"  # key of a plain-tensor storage's rows in the saved TensorDict
TRANSFORM_STATE = "transform.t"  # a transform's state_dict: loaded with weights_only=True
#: Chunks of chunked saves (rb_lightning.persist.chunks), shared by the checkpoints of a
#: directory: ``<dir>/buffer-chunks/<chunk>/``, beside the ``<ckpt>.buffer`` directories.
CHUNKS_DIR = "buffer-chunks"
#: The pickle torchrl's ``dumps`` (a Ray buffer's actor) writes for a buffer without
#: prefetch: accepted only when it holds plain values (checked without unpickling code).
PREFETCH_STATE = "prefetch.pkl"
#: Files a dump may hold besides the two above: JSON and raw tensor bytes.
_SAFE_SUFFIXES = (".json", ".memmap")
#: Window in which a file is mapped to verify its checksum (a multiple of the mmap granularity).
_READ_CHUNK_BYTES = 64 * 1024**2

#: What :func:`read_manifest` checks: ``"full"`` every file's size and checksum,
#: ``"size"`` every file's size, ``"none"`` only that the manifest is readable.
Verify = Literal["full", "size", "none"]
VERIFY_MODES: tuple[str, ...] = ("full", "size", "none")


def check_verify_mode(verify: str, argument: str = "verify") -> Verify:
    """``verify`` if it is one of :data:`VERIFY_MODES`; otherwise a :class:`UsageError` naming ``argument``.

    Examples:
        >>> check_verify_mode("size")
        'size'
    """
    if verify not in VERIFY_MODES:
        raise UsageError(
            argument,
            f"{argument}={verify!r} is not a verification mode: use 'full' (sizes and "
            "checksums of every file of a buffer checkpoint, the default), 'size' (file sizes "
            "only, for multi-GB buffers on disks you trust) or 'none'.",
        )
    return verify  # type: ignore[return-value]


# -- checksums ---------------------------------------------------------------------------------
def _tensor_digest(tensor: torch.Tensor) -> str:
    """``xxh3_64`` of a CPU tensor's bytes, read in place (no copy)."""
    flat = tensor.detach().reshape(-1)
    return xxhash.xxh3_64_hexdigest(flat.view(torch.uint8).numpy().data)


def _file_digest(path: Path) -> str:
    """``xxh3_64`` of a file's bytes through read-only mappings (``MAP_POPULATE`` where there is one), ~3x faster than reading."""
    digest = xxhash.xxh3_64()
    size = path.stat().st_size
    with open(path, "rb") as file:
        for offset in range(0, size, _READ_CHUNK_BYTES):
            length = min(_READ_CHUNK_BYTES, size - offset)
            with _map_read_only(file.fileno(), length, offset) as window:
                digest.update(window)
    return digest.hexdigest()


file_digest = _file_digest  # public name, for the chunk store


def _map_read_only(descriptor: int, length: int, offset: int) -> mmap.mmap:
    if os.name != "posix":
        return mmap.mmap(descriptor, length, access=mmap.ACCESS_READ, offset=offset)
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(descriptor, length, flags=flags, prot=mmap.PROT_READ, offset=offset)


class Digests(dict[str, str]):
    """Checksums of dump files, by path relative to the dump root, taken as they are written.

    ``add_written``: a TensorDict ``memmap`` just wrote, hashed through the mapping that wrote
    it; ``add_source``: a TensorDict torchrl's checkpointer writes under ``prefix``. Small files
    (JSON, sampler and writer state) are hashed from disk with the manifest.
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


# -- write / read ------------------------------------------------------------------------------
def _files(root: Path) -> dict[str, int]:
    return {
        path.relative_to(root).as_posix(): path.stat().st_size
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def write_manifest(
    root: Path, content: dict[str, Any], digests: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write ``manifest.json``: ``content``, the size and checksum of every file; return it (``digests=None``: sizes only)."""
    files = _files(root)
    content = dict(content)
    content["format"] = FORMAT_VERSION
    content["files"] = files
    if digests is not None:
        content[CHECKSUMS] = {
            name: digests.get(name) or _file_digest(root / name) for name in files
        }
    with open(root / MANIFEST, "w") as file:
        json.dump(content, file)
        file.flush()
        os.fsync(file.fileno())
    return content


def not_this_layout(root: Path, detail: str) -> BufferCheckpointError:
    """The error for a dump of a layout this rb_lightning does not read (``detail``: which)."""
    return BufferCheckpointError(
        f"The replay-buffer dump {root} has a layout this rb_lightning does not read "
        f"({detail}): the buffer format is version {FORMAT_VERSION} until rb_lightning's first "
        "release, and dumps of earlier, unreleased layouts are refused rather than guessed at. "
        "Resume from a checkpoint written by this version of rb_lightning, or start a new run."
    )


def _what_file_holds(name: str) -> str:
    """What the dump file ``name`` (relative path) holds, in a user's words."""
    parts = name.split("/")
    column = parts[-1].removesuffix(".memmap")

    def column_of(inner: list[str]) -> str:
        key = [*inner, column]
        return f"column {'.'.join(key)!r}" if len(key) > 1 else f"column {column!r}"

    if not name.endswith(".memmap"):
        return "metadata"
    if parts[0] == STORAGE_DIR:
        if parts[1:] == [f"{TENSOR_ROWS}.memmap"]:
            return "the stored tensor"
        return f"{column_of(parts[1:-1])} of the stored items"
    if parts[0] == CHUNKS_DIR and len(parts) > 2:
        return f"{column_of(parts[2:-1])} of the stored rows in chunk {parts[1]}"
    if parts[0] == LIST_DIR and len(parts) > 2:
        return f"{column_of(parts[2:-1])} of item {parts[1]}"
    if parts[0] == PENDING_DIR and len(parts) > 2:
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
    """Read and verify a dump's manifest; raise :class:`BufferCheckpointError`.

    ``verify``: ``"full"`` (default) sizes and checksums, ``"size"`` sizes, ``"none"`` only a
    readable manifest of this format.
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
        raise not_this_layout(root, f"{MANIFEST} says format {manifest.get('format')!r}")
    missing = [key for key in _REQUIRED if key not in manifest]
    if missing:
        raise not_this_layout(root, f"{MANIFEST} records no {', '.join(missing)}")
    store = root.parent.parent / CHUNKS_DIR
    if manifest.get("chunks") and not store.is_dir():
        raise BufferCheckpointError(
            f"The replay buffer saved in {root} keeps its rows in {store}, which is missing: "
            f"the checkpoint was copied or moved without its {CHUNKS_DIR}/ folder (saves of "
            f"BufferCheckpointIO(incremental=True)). Copy {CHUNKS_DIR}/ along with the .ckpt "
            "and its .ckpt.buffer/ folder, into the same folder as them."
        )
    if verify == "none":
        return manifest
    actual = _files(root)
    for name, size in manifest["files"].items():
        if actual.get(name) != size:
            found = "is missing" if name not in actual else f"holds {actual[name]} bytes"
            raise _corrupted(root, name, f"should hold {size} bytes and {found}")
    # A chunked save (rb_lightning.persist.chunks) keeps its rows in chunks shared by
    # the checkpoints of the directory, two levels up; each is checked like a file here.
    chunk_files = _chunk_files(root, manifest)
    for name, (path, size, _) in chunk_files.items():
        found_size = path.stat().st_size if path.is_file() else None
        if found_size != size:
            found = "is missing" if found_size is None else f"holds {found_size} bytes"
            raise _corrupted(root, name, f"should hold {size} bytes and {found}")
    if verify == "size":
        return manifest
    for name, digest in manifest.get(CHECKSUMS, {}).items():
        if _file_digest(root / name) != digest:
            raise _corrupted(root, name, "does not match its checksum (xxh3_64)")
    for name, (path, _, digest) in chunk_files.items():
        if digest is not None and _file_digest(path) != digest:
            raise _corrupted(root, name, "does not match its checksum (xxh3_64)")
    return manifest


def _chunk_files(root: Path, manifest: dict[str, Any]) -> dict[str, tuple[Path, int, str | None]]:
    """``buffer-chunks/<chunk>/<file>`` -> (path, size, checksum) for every chunk a manifest lists."""
    store = root.parent.parent / CHUNKS_DIR
    files = {}
    for chunk, record in manifest.get("chunks", {}).items():
        if not isinstance(chunk, str) or "/" in chunk or chunk.startswith("."):
            raise not_this_layout(root, f"a chunk named {chunk!r}")
        digests = record.get(CHECKSUMS, {})
        for name, size in record["files"].items():
            files[f"{CHUNKS_DIR}/{chunk}/{name}"] = (store / chunk / name, size, digests.get(name))
    return files


def check_plain_files(root: Path, *, written: bool = False) -> None:
    """Raise unless every file under ``root`` is JSON, a raw memmap or a weights-only file (``written``: a dump just made, removed on failure)."""
    for file in sorted(root.rglob("*")):
        if not file.is_file() or file.suffix in _SAFE_SUFFIXES:
            continue
        name = file.relative_to(root).as_posix()
        if file.name == TRANSFORM_STATE:
            continue  # read with torch.load(weights_only=True): tensors and containers only
        if file.name == PREFETCH_STATE and torchrl_compat.is_empty_prefetch_pickle(file):
            continue  # torchrl's dumps of a buffer without prefetch: plain values only
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
