"""Open a saved replay buffer for reading, whatever wrote it: a Lightning run, ``dump_buffer``, torchrl.

:func:`open_saved_buffer` takes a path and returns a fresh buffer holding the
saved content, and says what the path was. It reads:

* a Lightning run: its directory (``runs/<config>/version_<N>``, meaning its
  ``checkpoints/last.ckpt``), a config's directory of runs (``runs/<config>``:
  the newest ``last.ckpt``), or a ``.ckpt`` written by a run with a
  :class:`~rb_lightning.ReplayBufferDataModule`, whichever way the buffer was
  saved (inside the ``.ckpt``, memory-mapped beside it, a ``ListStorage``, a
  :class:`~rb_lightning.BufferMixture` (one member, or all with a ``"source"``
  column), one buffer per DDP rank (one rank, or all with a ``"source"`` column
  holding the rank), a Ray buffer's content saved by its actor);
* a :func:`rb_lightning.checkpoint.dump_buffer` directory;
* a ``ReplayBuffer.dumps(path)`` directory (tensor storages);
* a ``torch.save(rb, path)`` file (or of a ``TensorDict`` of items): a pickle,
  read only with ``allow_pickle=True``.

A checkpoint is read with ``torch.load(weights_only=True)``: nothing is
unpickled. Dumps are read by :func:`rb_lightning.checkpoint.load_dump` into a
buffer built like the saved one (storage, capacity, sampler and writer are in
the dump's manifest).

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.checkpoint import dump_buffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    >>> path = f"{tempfile.mkdtemp()}/buffer"
    >>> _ = dump_buffer(rb, path)
    >>> saved = open_saved_buffer(path)
    >>> saved.kind, saved.replay_buffer[:]["x"].tolist()
    ('a dump_buffer directory', [0, 1, 2])
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torchrl.data
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning import torchrl_compat
from rb_lightning.buffers.handles import resolve_buffer
from rb_lightning.buffers.load import (
    checkpoint_buffer_state,
    checkpoint_dumps,
    checkpoint_path_of,
    read_torch_file,
)
from rb_lightning.buffers.mixture import BufferMixture
from rb_lightning.columns import SAMPLER_INFO_KEYS, flat_name, leaf_keys
from rb_lightning.errors import BufferCheckpointError, UsageError
from rb_lightning.persist.dumps import load_dump
from rb_lightning.persist.manifest import MANIFEST, read_manifest

__all__ = ["SavedBuffer", "open_saved_buffer"]

#: What a buffer's storage may be rebuilt as, by the class name its dump records.
_STORAGES = ("LazyTensorStorage", "LazyMemmapStorage", "ListStorage", "LazyStackStorage")


@dataclass
class SavedBuffer:
    """A saved buffer, opened: its content in a fresh buffer, and what the path was.

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
) -> SavedBuffer:
    """Read the replay buffer saved at ``path`` (see the module doc for what it takes).

    Args:
        path: A run directory, a ``.ckpt``, a dump directory or a saved file.

    Keyword Args:
        member: For a checkpoint of a :class:`~rb_lightning.BufferMixture`: the
            member to read; default: all, with a ``"source"`` column.
        rank: For a checkpoint of a DDP run (one buffer per rank): the rank to
            read; default: all, with a ``"source"`` column holding the rank.
        allow_pickle: Read a ``torch.save(rb, path)`` file (a pickle: it can run
            code when read; only for files you trust). Never needed for a run's
            checkpoint or a dump.

    Raises:
        UsageError: ``path`` is not a saved buffer, or ``member`` / ``rank`` /
            ``allow_pickle`` do not fit it; the message says what the path is
            and how to read it.
        BufferCheckpointError: The saved buffer is damaged or incomplete.
    """
    location = Path(path)
    if not location.exists():
        raise UsageError(
            "path",
            f"{location}: no such file or directory. Pass the run directory of a fit "
            "(runs/<config>/version_<N>), its checkpoints/last.ckpt, a directory written by "
            "dump_buffer(rb, path) or rb.dumps(path), or a file written by torch.save(rb, path).",
        )
    if location.is_dir() and (location / MANIFEST).is_file():
        _refuse_selection(location, "a dump_buffer directory", member, rank)
        return SavedBuffer(_load_dump(location), location, "a dump_buffer directory")
    if location.is_dir() and torchrl_compat.is_dumps_directory(location):
        _refuse_selection(location, "an rb.dumps() directory", member, rank)
        rb = _buffer_of(torchrl_compat.read_dumps_items(location))
        return SavedBuffer(rb, location, "an rb.dumps() directory")
    checkpoint = checkpoint_path_of(location)
    if checkpoint is None:
        raise UsageError("path", _not_a_saved_buffer(location))
    return _open_file(checkpoint, location, member=member, rank=rank, allow_pickle=allow_pickle)


def _open_file(
    file: Path, given: Path, *, member: str | None, rank: int | None, allow_pickle: bool
) -> SavedBuffer:
    try:
        content = read_torch_file(file, allow_pickle=allow_pickle)
    except BufferCheckpointError as error:
        argument = "allow_pickle" if "allow_pickle" in str(error) else "path"
        raise UsageError(argument, str(error)) from None
    state = checkpoint_buffer_state(content)
    if state is None:
        if isinstance(content, ReplayBuffer | TensorDictBase):
            _refuse_selection(file, f"a torch.save()d {type(content).__name__}", member, rank)
            rb = content if isinstance(content, ReplayBuffer) else _buffer_of(content)
            return SavedBuffer(rb, file, f"a torch.save()d {type(content).__name__}")
        if isinstance(content, dict) and "state_dict" in content:
            what = "a Lightning checkpoint without a replay buffer: the run's DataModule is not "
            fix = (
                "a ReplayBufferDataModule. Export the buffer in Python where it lives: "
                "rb_lightning.to_hf_dataset(rb, streaming=False).save_to_disk(out)."
            )
            raise UsageError("path", f"{file} is {what}{fix}")
        raise UsageError(
            "path",
            f"{file} holds a {type(content).__name__} written by torch.save, not a replay buffer "
            "or a Lightning checkpoint of one. Pass a run directory, its .ckpt, a dump_buffer "
            "directory, or a torch.save(rb, path) file.",
        )
    kind = _checkpoint_kind(state, file, given)
    with checkpoint_dumps(state, file) as dumps:
        names = list(dumps)
        picked = _select(names, state, file, member=member, rank=rank)
        buffers = {name: _load_dump(dumps[name]) for name in picked}
    if len(buffers) == 1:
        (rb,) = buffers.values()
        return SavedBuffer(rb, file, kind)
    return SavedBuffer(BufferMixture(buffers), file, kind, sources=list(buffers))


def _checkpoint_kind(state: dict[str, Any], file: Path, given: Path) -> str:
    location = state["location"]
    if location == "mixture":
        what = f"a BufferMixture of {list(state['names'])}"
    elif "world_size" in state:
        what = f"one buffer per DDP rank ({state['world_size']} ranks), saved beside it"
    elif state.get("remote"):
        what = "a Ray buffer's content, saved beside it by its actor"
    elif location == "inline":
        what = "its buffer inside the .ckpt"
    else:
        what = "its buffer saved beside it"
    run = f" (the run {given})" if given != file else ""
    return f"a Lightning checkpoint{run}, {what}"


def _select(
    names: list[str], state: dict[str, Any], file: Path, *, member: str | None, rank: int | None
) -> list[str]:
    """The dumps that ``member`` / ``rank`` pick out of ``names`` (all when not given)."""
    mixture = state["location"] == "mixture"
    ranks = "world_size" in state
    if member is not None and not mixture:
        raise UsageError(
            "member",
            f"{member!r} names a member of a BufferMixture, and {file} holds "
            f"{'per-rank buffers' if ranks else 'one buffer'}, not a mixture. Drop it.",
        )
    if rank is not None and not ranks:
        raise UsageError(
            "rank",
            f"rank {rank} picks one DDP rank's buffer, and {file} holds "
            f"{'a BufferMixture' if mixture else 'the buffer of one process'}. Drop it.",
        )
    if member is not None:
        if member not in names:
            raise UsageError(
                "member",
                f"{member!r} is not a member of the BufferMixture in {file}; its members are "
                f"{names}. Pass one of them, or none to export all (with a 'source' column).",
            )
        return [member]
    if rank is not None:
        if f"rank{rank}" not in names:
            raise UsageError(
                "rank",
                f"{file} holds the buffers of ranks 0 to {len(names) - 1}, not rank {rank}. "
                "Pass one of them, or none to export all (with a 'source' column).",
            )
        return [f"rank{rank}"]
    return names


def _refuse_selection(path: Path, kind: str, member: str | None, rank: int | None) -> None:
    if member is not None:
        raise UsageError("member", f"{path} is {kind}, one buffer, not a mixture. Drop it.")
    if rank is not None:
        raise UsageError("rank", f"{path} is {kind}, one buffer, not per-rank ones. Drop it.")


def _not_a_saved_buffer(location: Path) -> str:
    if location.is_dir():
        shown = sorted(p.name for p in location.iterdir())[:6]
        return (
            f"{location} is a directory but no saved buffer or run: it has no "
            f"checkpoints/last.ckpt (a run directory, runs/<config>/version_<N>), no {MANIFEST} "
            "(a dump_buffer directory) and no storage/storage_metadata.json (an rb.dumps() "
            f"directory); it holds {shown or 'nothing'}. A run that has not saved yet has no "
            "checkpoint: let it reach its first save (every_n_train_steps) or finish."
        )
    return f"{location} is not a file or directory this command reads."


def _load_dump(root: Path) -> ReplayBuffer:
    """A new buffer built like the one saved in the dump ``root``, holding its content."""
    manifest = read_manifest(root)
    rb = _build_like(manifest.get("build") or {}, root)
    load_dump(rb, root)
    return rb


def _build_like(build: dict[str, Any], root: Path) -> ReplayBuffer:
    """A ``ReplayBuffer`` with the storage, sampler and writer classes a manifest records."""
    names = {part: build.get(part) for part in ("storage", "sampler", "writer")}
    if names["storage"] not in _STORAGES or not all(
        isinstance(_class_named(str(name), build.get(f"{part}_module")), type)
        for part, name in names.items()
    ):
        raise UsageError(
            "path",
            f"The buffer saved in {root} was built with {names}, which this command cannot "
            "rebuild by name. Build one like it in Python and read it with "
            "rb_lightning.checkpoint.load_buffer(rb, path), then "
            "rb_lightning.to_hf_dataset(rb, streaming=False).save_to_disk(out).",
        )
    storage = getattr(torchrl.data, names["storage"])(max_size=int(build["capacity"]))
    settings = dict(build.get("sampler_settings") or {})
    try:
        sampler = _class_named(str(names["sampler"]), build.get("sampler_module"))(**settings)
        writer = _class_named(str(names["writer"]))()
    except TypeError as error:
        raise UsageError(
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
