"""Reading a saved buffer back: from a dump, a Lightning ``.ckpt`` or a run directory.

:func:`load_buffer` restores a buffer from any of them; :func:`checkpoint_path_of`,
:func:`read_torch_file`, :func:`checkpoint_buffer_state` and :func:`checkpoint_dumps`
are its steps, for tools that read saved buffers their own way
(``rb-lightning-export-hf``).

Examples:
    >>> checkpoint_buffer_state({"MyDataModule": {"buffer": {"location": "beside"}}})
    {'location': 'beside'}
"""

from __future__ import annotations

import contextlib
import os
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer

from rb_lightning.buffers.handles import resolve_buffer
from rb_lightning.buffers.state import restore_mixture_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.beside import RANK_PREFIX, resolve_reference
from rb_lightning.persist.dumps import load_dump
from rb_lightning.persist.files import unpacked_directory
from rb_lightning.persist.manifest import MANIFEST, Verify
from rb_lightning.persist.run_paths import LAST_CHECKPOINT, latest_checkpoint, run_checkpoint

__all__ = [
    "checkpoint_buffer_state",
    "checkpoint_dumps",
    "checkpoint_path_of",
    "load_buffer",
    "read_torch_file",
]


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
    only for files you trust. Any file ``torch.save`` did not write (text, an empty
    file) is a :class:`BufferCheckpointError` saying so.
    """
    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise BufferCheckpointError(f"{path} is empty (0 bytes). {_NOT_TORCH_FIX}")
    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError:
        if allow_pickle:
            raise
        # Only torch.save's zip archives list their globals; any other file was never one.
        if not zipfile.is_zipfile(path):
            raise BufferCheckpointError(_not_torch_file(path)) from None
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
    except Exception:
        # On a file torch.save did not write, the unpickler fails with whatever the bytes
        # lead it to (EOFError, KeyError, IndexError, RuntimeError...): none says more.
        raise BufferCheckpointError(_not_torch_file(path)) from None


_NOT_TORCH_FIX = (
    "Pass a Lightning checkpoint of a run (runs/<config>/version_<N>/checkpoints/last.ckpt, or "
    "the run directory), a directory written by dump_buffer(rb, path) or rb.dumps(path), or a "
    "file written by torch.save(rb, path)."
)


def _not_torch_file(path: str | os.PathLike) -> str:
    return f"{path} is not a file written by torch.save, so not a checkpoint. {_NOT_TORCH_FIX}"


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
            yield {"": stack.enter_context(unpacked_directory(state["archive"], checkpoint_path))}
        elif location == "beside":
            root = resolve_reference(state, checkpoint_path)
            if "world_size" in state:
                yield {
                    f"{RANK_PREFIX}{rank}": root / f"{RANK_PREFIX}{rank}"
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
                f"Unknown replay-buffer location {location!r} in {checkpoint_path}: this "
                "rb_lightning writes 'inline', 'beside' and 'mixture'. Read a checkpoint written "
                "by this version of rb_lightning."
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

    ``path`` is a :func:`~rb_lightning.checkpoint.dump_buffer` directory (read by
    :func:`~rb_lightning.checkpoint.load_dump`), a ``.ckpt`` written by a run
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
            (see :func:`~rb_lightning.checkpoint.read_manifest`).

    Returns:
        The batches the run had read ahead of the saved step (for an exact resume).

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from rb_lightning.checkpoint import buffer_state
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
        return load_dump(replay_buffer, location, verify=verify)
    state = checkpoint_buffer_state(read_torch_file(checkpoint))
    if state is None:
        raise BufferCheckpointError(
            f"{checkpoint} holds no replay buffer: it was not written by a run whose DataModule "
            "is a ReplayBufferDataModule. Pass the .ckpt (or run directory) of such a run, or a "
            "directory written by dump_buffer(rb, path)."
        )
    if _restores_whole_mixture(replay_buffer, state):
        return restore_mixture_state(replay_buffer, state, checkpoint, verify=verify)
    with checkpoint_dumps(state, checkpoint) as dumps:
        name = _pick_dump(dumps, state, checkpoint, member=member, rank=rank)
        return load_dump(replay_buffer, dumps[name], verify=verify)


def _restores_whole_mixture(replay_buffer: Any, state: dict[str, Any]) -> bool:
    """Whether a mixture's checkpoint goes into a whole mixture (every member), by its handle."""
    whole = resolve_buffer(replay_buffer).source_names is not None
    return state.get("location") == "mixture" and whole


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
        name = f"{RANK_PREFIX}{rank}"
        if name not in dumps:
            given = "no rank" if rank is None else f"rank={rank}"
            raise BufferCheckpointError(
                f"{checkpoint} holds one buffer per DDP rank ({len(dumps)} ranks), and {given} "
                f"was given. Pass rank=0 to {len(dumps) - 1} (--rank on the command line)."
            )
        return name
    return ""
