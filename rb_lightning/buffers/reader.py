"""The one reader of saved replay buffers: whatever wrote them, into a buffer or opened fresh.

:func:`load_buffer` restores a buffer you built; :func:`open_saved_buffer` returns a fresh
``ReplayBuffer`` built like the saved one (:meth:`SavedBuffer.read` also says what the path
was). Both take the same paths and ``member`` / ``rank`` and raise the same
:class:`~rb_lightning.errors.SavedBufferError` for the same mistake. A path is a Lightning
run (its directory, a config's directory of runs, or a ``.ckpt``: its
:class:`~rb_lightning.persist.record.BufferRecord` says where the buffer is), a
:func:`~rb_lightning.checkpoint.dump_buffer` directory, a ``ReplayBuffer.dumps`` directory
(opened only), or a ``torch.save`` pickle (opened only with ``allow_pickle=True``).

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.persist.dumps import dump_buffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    >>> path = f"{tempfile.mkdtemp()}/buffer"
    >>> _ = dump_buffer(rb, path)
    >>> open_saved_buffer(path)[:]["x"].tolist(), SavedBuffer.read(path).kind
    ([0, 1, 2], 'a dump_buffer directory')
    >>> restored = ReplayBuffer(storage=LazyTensorStorage(8))
    >>> load_buffer(restored, path), restored[:]["x"].tolist()
    ([], [0, 1, 2])
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torchrl.data
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import torchrl_compat
from rb_lightning.buffers.handles import resolve_buffer
from rb_lightning.buffers.mixture import BufferMixture
from rb_lightning.buffers.state import restore_mixture_state
from rb_lightning.columns import SAMPLER_INFO_KEYS, flat_name, leaf_keys
from rb_lightning.errors import (
    NotASavedBufferError,
    PickleRefusedError,
    SavedBufferSelectionError,
)
from rb_lightning.persist.dumps import load_dump
from rb_lightning.persist.manifest import MANIFEST, Verify, read_manifest
from rb_lightning.persist.record import RANK_PREFIX, BufferRecord, find_record, record_dumps
from rb_lightning.persist.run_dirs import checkpoint_path_of

__all__ = [
    "SavedBuffer",
    "load_buffer",
    "open_saved_buffer",
    "read_torch_file",
]

#: What a buffer's storage may be rebuilt as, by the class name its dump records.
_STORAGES = ("LazyTensorStorage", "LazyMemmapStorage", "ListStorage", "LazyStackStorage")
_WHAT_TO_PASS = (
    "Pass the run directory of a fit (runs/<config>/version_<N>), its checkpoints/last.ckpt, a "
    "directory written by dump_buffer(rb, path) or rb.dumps(path), or a file written by "
    "torch.save(rb, path)."
)


# -- what a path is ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Located:
    """What a path given to the reader is: ``file`` is what will be read."""

    file: Path
    what: Literal["dump", "rb_dumps", "checkpoint"]


def _locate(path: str | os.PathLike) -> _Located:
    location = Path(path)
    if not location.exists():
        raise NotASavedBufferError(
            "path", f"{location}: no such file or directory. {_WHAT_TO_PASS}"
        )
    if location.is_dir() and (location / MANIFEST).is_file():
        return _Located(location, "dump")
    if location.is_dir() and torchrl_compat.is_dumps_directory(location):
        return _Located(location, "rb_dumps")
    checkpoint = checkpoint_path_of(location)
    if checkpoint is None:
        raise NotASavedBufferError("path", _not_a_saved_buffer(location))
    return _Located(checkpoint, "checkpoint")


def _not_a_saved_buffer(location: Path) -> str:
    shown = sorted(p.name for p in location.iterdir())[:6]
    return (
        f"{location} is a directory but no saved buffer or run: it has no "
        f"checkpoints/last.ckpt (a run directory, runs/<config>/version_<N>), no {MANIFEST} "
        "(a dump_buffer directory) and no storage/storage_metadata.json (an rb.dumps() "
        f"directory); it holds {shown or 'nothing'}. A run that has not saved yet has no "
        "checkpoint: let it reach its first save (every_n_train_steps) or finish."
    )


def read_torch_file(path: str | os.PathLike, *, allow_pickle: bool = False) -> Any:
    """``torch.load(path)`` with ``weights_only=True`` unless ``allow_pickle``.

    A checkpoint of a run with the DataModule holds plain data only, so nothing is unpickled.
    Other objects raise :class:`~rb_lightning.errors.PickleRefusedError` naming them (unpickling
    can run any code); a file ``torch.save`` did not write raises
    :class:`~rb_lightning.errors.NotASavedBufferError`.
    """
    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise NotASavedBufferError("path", f"{path} is empty (0 bytes). {_WHAT_TO_PASS}")
    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError:
        if allow_pickle:
            raise
        # Only torch.save's zip archives list their globals; any other file was never one.
        if not zipfile.is_zipfile(path):
            raise NotASavedBufferError("path", _not_torch_file(path)) from None
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        if any(name.endswith("replay_buffers.ReplayBuffer") for name in found):
            what = "a whole ReplayBuffer object pickled by torch.save(rb, path)"
        elif any(name.startswith("tensordict.") for name in found):
            what = "a TensorDict pickled by torch.save(td, path)"
        else:
            shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            what = f"pickled Python objects ({shown})"
        raise PickleRefusedError(
            "allow_pickle",
            f"{path} holds {what}: reading it means unpickling, which can run any code, so it "
            "is refused. If you made the file yourself and trust it, pass allow_pickle=True "
            "(rb-lightning-export-hf --allow-pickle); to share a buffer, save it with "
            "rb_lightning.checkpoint.dump_buffer(rb, path) instead (tensors and JSON only).",
        ) from None
    except Exception:
        # On a file torch.save did not write, the unpickler fails with whatever the bytes
        # lead it to (EOFError, KeyError, IndexError, RuntimeError...): none says more.
        raise NotASavedBufferError("path", _not_torch_file(path)) from None


def _not_torch_file(path: str | os.PathLike) -> str:
    return f"{path} is not a file written by torch.save, so not a checkpoint. {_WHAT_TO_PASS}"


def _checkpoint_record(file: Path, content: Any) -> BufferRecord:
    record = find_record(content)
    if record is not None:
        return record
    if isinstance(content, dict) and "state_dict" in content:
        raise NotASavedBufferError(
            "path",
            f"{file} is a Lightning checkpoint without a replay buffer: the run's DataModule is "
            "not a ReplayBufferDataModule. Export the buffer in Python where it lives: "
            "rb_lightning.to_hf_dataset(rb, streaming=False).save_to_disk(out).",
        )
    raise NotASavedBufferError(
        "path",
        f"{file} holds a {type(content).__name__} written by torch.save, not a replay buffer or "
        "a Lightning checkpoint of one. Pass a run directory, its .ckpt, a dump_buffer "
        "directory, or a torch.save(rb, path) file.",
    )


# -- which saved buffers to read -----------------------------------------------------------------
def _select(
    record: BufferRecord,
    names: list[str],
    file: Path,
    *,
    member: str | None,
    rank: int | None,
    several: bool,
) -> list[str]:
    """The dumps of ``names`` that ``member`` / ``rank`` pick (all when not given and ``several``)."""
    ranks = record.kind == "ranks"
    if record.kind == "elsewhere":
        raise NotASavedBufferError(
            "path",
            f"{file} was saved by a DDP rank other than 0 of a run with a Ray buffer: the "
            "buffer is in rank 0's checkpoint. Read that one.",
        )
    if member is not None and not record.is_mixture:
        held = "per-rank buffers" if ranks else "one buffer"
        raise SavedBufferSelectionError(
            "member",
            f"member={member!r} names a member of a BufferMixture, and {file} holds {held}, "
            "not a mixture. Drop member.",
        )
    if rank is not None and not ranks:
        held = "a BufferMixture" if record.is_mixture else "the buffer of one process"
        raise SavedBufferSelectionError(
            "rank",
            f"rank={rank} picks one DDP rank's buffer, and {file} holds {held}. Drop rank.",
        )
    if member is not None:
        if member not in names:
            raise SavedBufferSelectionError(
                "member",
                f"member={member!r} is not a member of the BufferMixture in {file}; its members "
                f"are {names}. Pass one of them (--member on the command line)"
                + (", or none to read all (with a 'source' column)." if several else "."),
            )
        return [member]
    if rank is not None:
        if f"{RANK_PREFIX}{rank}" not in names:
            raise SavedBufferSelectionError(
                "rank",
                f"{file} holds the buffers of ranks 0 to {len(names) - 1}, not rank {rank}. Pass "
                "one of them (--rank on the command line)"
                + (", or none to read all (with a 'source' column)." if several else "."),
            )
        return [f"{RANK_PREFIX}{rank}"]
    if several or len(names) == 1:
        return names
    what, argument = ("a BufferMixture of", "member") if record.is_mixture else ("", "rank")
    held = f"{what} {names}" if what else f"one buffer per DDP rank ({len(names)} ranks)"
    raise SavedBufferSelectionError(
        argument,
        f"{file} holds {held.strip()}, and no {argument} was given: one buffer is restored "
        f"from one of them. Pass {argument}=<one of them> (--{argument} on the command line)"
        + (", or restore into a BufferMixture with those members." if record.is_mixture else "."),
    )


def _refuse_selection(path: Path, kind: str, member: str | None, rank: int | None) -> None:
    if member is not None:
        raise SavedBufferSelectionError(
            "member", f"{path} is {kind}, one buffer, not a mixture. Drop member."
        )
    if rank is not None:
        raise SavedBufferSelectionError(
            "rank", f"{path} is {kind}, one buffer, not per-rank ones. Drop rank."
        )


# -- restoring a buffer you built ----------------------------------------------------------------
def load_buffer(
    replay_buffer: ReplayBuffer,
    path: str | os.PathLike,
    *,
    member: str | None = None,
    rank: int | None = None,
    verify: Verify = "full",
) -> list[TensorDictBase]:
    """Restore ``replay_buffer`` from a dump, a Lightning checkpoint or a run directory.

    ``replay_buffer`` must be built like the saved one (storage, capacity, sampler, writer);
    a :class:`~rb_lightning.BufferMixture` takes a whole saved mixture.

    Keyword Args:
        member: The member to read from a mixture's checkpoint.
        rank: The rank whose buffer to read from a DDP run's checkpoint.
        verify: What is checked before the buffer is touched
            (:func:`~rb_lightning.persist.manifest.read_manifest`).

    Returns:
        The batches the run had read ahead of the saved step (for an exact resume).

    Raises:
        SavedBufferError: ``path``, ``member`` or ``rank`` does not fit the saved buffer.
        BufferCheckpointError: The saved buffer is damaged, or built unlike ``replay_buffer``.
    """
    located = _locate(path)
    if located.what == "dump":
        _refuse_selection(located.file, "a dump_buffer directory", member, rank)
        return load_dump(replay_buffer, located.file, verify=verify)
    if located.what == "rb_dumps":
        raise NotASavedBufferError(
            "path",
            f"{located.file} is an rb.dumps() directory, torchrl's own format: restore it with "
            "rb.loads(path), or fill a DataModule's buffer from it with "
            "rb_lightning.sources.LoadDirectory(path).",
        )
    record = _checkpoint_record(located.file, read_torch_file(located.file))
    whole_mixture = resolve_buffer(replay_buffer).source_names is not None
    if record.is_mixture and whole_mixture and member is None:
        return restore_mixture_state(replay_buffer, record, located.file, verify=verify)
    with record_dumps(record, located.file) as dumps:
        (name,) = _select(
            record, list(dumps), located.file, member=member, rank=rank, several=False
        )
        return load_dump(replay_buffer, dumps[name], verify=verify)


# -- opening a saved buffer fresh ----------------------------------------------------------------
@dataclass
class SavedBuffer:
    """A saved buffer, opened (:meth:`read`): its content in a fresh buffer, and what the path was.

    Attributes:
        replay_buffer: A ``ReplayBuffer`` with the saved content, or a
            :class:`~rb_lightning.BufferMixture` when several buffers were read
            (its ``"source"`` column tells them apart).
        path: The file or directory that was read (a run directory's ``.ckpt``).
        kind: What ``path`` is, in words.
        sources: When several buffers were read: the name behind each
            ``"source"`` id (mixture members, or ``rank0``, ``rank1``...).
    """

    replay_buffer: ReplayBuffer
    path: Path
    kind: str
    sources: list[str] = field(default_factory=list)

    @classmethod
    def read(
        cls,
        path: str | os.PathLike,
        *,
        member: str | None = None,
        rank: int | None = None,
        allow_pickle: bool = False,
    ) -> SavedBuffer:
        """Read the buffer saved at ``path`` as :func:`open_saved_buffer` does, with what it was."""
        located = _locate(path)
        if located.what == "dump":
            _refuse_selection(located.file, "a dump_buffer directory", member, rank)
            return cls(_open_dump(located.file), located.file, "a dump_buffer directory")
        if located.what == "rb_dumps":
            _refuse_selection(located.file, "an rb.dumps() directory", member, rank)
            rb = _buffer_of(torchrl_compat.read_dumps_items(located.file))
            return cls(rb, located.file, "an rb.dumps() directory")
        content = read_torch_file(located.file, allow_pickle=allow_pickle)
        if find_record(content) is None and isinstance(content, ReplayBuffer | TensorDictBase):
            what = f"a torch.save()d {type(content).__name__}"
            _refuse_selection(located.file, what, member, rank)
            rb = content if isinstance(content, ReplayBuffer) else _buffer_of(content)
            return cls(rb, located.file, what)
        record = _checkpoint_record(located.file, content)
        run = f" (the run {Path(path)})" if Path(path) != located.file else ""
        kind = f"a Lightning checkpoint{run}, {record.describe()}"
        with record_dumps(record, located.file) as dumps:
            names = _select(
                record, list(dumps), located.file, member=member, rank=rank, several=True
            )
            buffers = {name: _open_dump(dumps[name]) for name in names}
        if len(buffers) == 1:
            (rb,) = buffers.values()
            return cls(rb, located.file, kind)
        return cls(BufferMixture(buffers), located.file, kind, sources=list(buffers))

    def keys(self) -> list[NestedKey]:
        """The keys of the stored items (with ``"source"`` when several buffers were read)."""
        if len(self.replay_buffer) == 0:
            return []
        return leaf_keys(_first_items(self.replay_buffer))

    def describe(self) -> str:
        """What the buffer holds: item count, then one line per column (dtype, item shape).

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
            >>> _ = rb.extend(TensorDict({"obs": torch.zeros(2, 3)}, batch_size=[2]))
            >>> print(SavedBuffer(rb, Path("buf"), "a dump_buffer directory").describe())
            buf: a dump_buffer directory
            2 items
              obs  float32  [3]
        """
        lines = [f"{self.path}: {self.kind}", f"{len(self.replay_buffer):,} items"]
        if self.sources:
            counts = [len(rb) for rb in self.replay_buffer.members.values()]
            parts = [
                f"{i} = {n} ({c:,})"
                for i, (n, c) in enumerate(zip(self.sources, counts, strict=True))
            ]
            lines.append(f"  source ids: {', '.join(parts)}")
        if len(self.replay_buffer):
            first = _first_items(self.replay_buffer)
            rows: list[tuple[str, str, str]] = []
            for key in self.keys():
                value = first.get(key)
                if isinstance(value, torch.Tensor):
                    kind = str(value.dtype).removeprefix("torch.")
                    rows.append((flat_name(key), kind, str(list(value.shape[1:]))))
                else:
                    items = value.tolist() if hasattr(value, "tolist") else [value]
                    rows.append((flat_name(key), type(items[0]).__name__, ""))
            name_width = max(len(name) for name, _, _ in rows)
            dtype_width = max(len(dtype) for _, dtype, _ in rows)
            for name, dtype, shape in rows:
                note = "  (torchrl's bookkeeping: exported only if asked for)"
                line = f"  {name:<{name_width}}  {dtype:<{dtype_width}}  {shape}"
                lines.append((line + note if name in SAMPLER_INFO_KEYS else line).rstrip())
        return "\n".join(lines)


def _first_items(replay_buffer: ReplayBuffer) -> TensorDictBase:
    return resolve_buffer(replay_buffer).read(0, 1)


def open_saved_buffer(
    path: str | os.PathLike,
    *,
    member: str | None = None,
    rank: int | None = None,
    allow_pickle: bool = False,
) -> ReplayBuffer:
    """A fresh ``ReplayBuffer`` built like the one saved at ``path``, holding its content.

    Storage, capacity, sampler and writer are the saved ones; several buffers (a mixture's
    members, a DDP run's ranks) come as a :class:`~rb_lightning.BufferMixture` with a
    ``"source"`` column.

    Args:
        path: A run directory, a ``.ckpt``, a dump directory or a saved file.

    Keyword Args:
        member: For a mixture's checkpoint: the member to read; default: all.
        rank: For a DDP run's checkpoint: the rank to read; default: all.
        allow_pickle: Read a ``torch.save(rb, path)`` file (it can run code: only files you
            trust). Never needed for a checkpoint or a dump.

    Raises:
        SavedBufferError: ``path`` is not a saved buffer, or ``member`` / ``rank`` /
            ``allow_pickle`` do not fit it; the message says how to read it.
        BufferCheckpointError: The saved buffer is damaged or incomplete.

    Examples:
        >>> import tempfile
        >>> from tensordict import TensorDict
        >>> from rb_lightning.persist.dumps import dump_buffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
        >>> path = f"{tempfile.mkdtemp()}/buffer"
        >>> _ = dump_buffer(rb, path)
        >>> opened = open_saved_buffer(path)
        >>> len(opened), opened.storage.max_size
        (3, 8)
    """
    return SavedBuffer.read(path, member=member, rank=rank, allow_pickle=allow_pickle).replay_buffer


def _open_dump(root: Path) -> ReplayBuffer:
    """A new buffer built like the one saved in the dump ``root``, holding its content."""
    manifest = read_manifest(root)
    rb = _build_like(manifest.get("build") or {}, root)
    load_dump(rb, root)
    return rb


def _build_like(build: dict[str, Any], root: Path) -> ReplayBuffer:
    """A ``ReplayBuffer`` with the storage, sampler and writer classes a manifest records."""
    names = {part: build.get(part) for part in ("storage", "sampler", "writer")}
    classes = {
        part: _class_named(str(name), build.get(f"{part}_module")) for part, name in names.items()
    }
    if names["storage"] not in _STORAGES or not all(isinstance(c, type) for c in classes.values()):
        raise NotASavedBufferError(
            "path",
            f"The buffer saved in {root} was built with {names}, which this command cannot "
            "rebuild by name. Build one like it in Python and read it with "
            "rb_lightning.checkpoint.load_buffer(rb, path), then "
            "rb_lightning.to_hf_dataset(rb, streaming=False).save_to_disk(out).",
        )
    storage = classes["storage"](max_size=int(build["capacity"]))
    settings = dict(build.get("sampler_settings") or {})
    try:
        sampler = classes["sampler"](**settings)
        writer = classes["writer"]()
    except TypeError as error:
        raise NotASavedBufferError(
            "path",
            f"The sampler or writer of the buffer saved in {root} ({names}) cannot be rebuilt "
            f"from its settings {settings} ({error}). Build one like it in Python and read it "
            "with rb_lightning.checkpoint.load_buffer(rb, path).",
        ) from None
    return ReplayBuffer(storage=storage, sampler=sampler, writer=writer)


def _class_named(name: str, module: str | None = None) -> Any:
    """The class ``name`` of torchrl, or of the module the build recorded (``None``: neither).

    Only modules of rb_lightning and torchrl are imported: the path comes from a file.
    """
    if module and module.split(".")[0] in ("rb_lightning", "torchrl"):
        with contextlib.suppress(ImportError):
            return getattr(importlib.import_module(module), name, None)
    return getattr(torchrl.data, name, None)


def _buffer_of(items: TensorDictBase) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(max(1, len(items))))
    if len(items):
        rb.extend(items)
    return rb
