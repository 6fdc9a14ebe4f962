"""A replay buffer to a dump directory and back: :func:`dump_buffer` and :func:`load_dump`.

Loading verifies the dump before the buffer is touched and refuses a directory holding any
other file or a buffer built differently, each with a :class:`BufferCheckpointError` that
names the path, the file and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import TensorStorage

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.build import SAME_BUILD_HINT, buffer_build, check_same_build
from rb_lightning.persist.components import dump_pending_batches
from rb_lightning.persist.layouts import layout_named, layout_of, writes_filled_rows_only
from rb_lightning.persist.manifest import (
    PENDING_DIR,
    Digests,
    Verify,
    check_plain_files,
    read_manifest,
    write_manifest,
)

__all__ = ["buffer_nbytes", "dump_buffer", "dump_nbytes", "load_dump"]


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


def dump_buffer(
    replay_buffer: ReplayBuffer,
    path: str | os.PathLike,
    *,
    pending_batches: Sequence[Any] = (),
    extra: dict[str, Any] | None = None,
    checksums: bool = True,
) -> dict[str, Any]:
    """Write ``replay_buffer`` to the new directory ``path`` and return its manifest.

    Only memory-mapped tensors and JSON are written, never a pickle, so loading runs no code
    from the files. Checksums are taken from the bytes being written; files are ``fsync``-ed
    by :func:`~rb_lightning.checkpoint.write_version`, not here.

    Args:
        replay_buffer: The buffer to save.
        path: A directory that must not exist yet.

    Keyword Args:
        pending_batches: Batches sampled but not yet trained on, handed out first on resume.
        extra: JSON-serialisable values recorded in the manifest.
        checksums: Record an ``xxh3_64`` checksum of every file (default); ``False``: sizes only.

    Examples:
        >>> import tempfile
        >>> from torchrl.data import ListStorage
        >>> rb = ReplayBuffer(storage=ListStorage(4))
        >>> rb.add(torch.arange(3))
        0
        >>> manifest = dump_buffer(rb, f"{tempfile.mkdtemp()}/dump")
        >>> manifest["layout"], manifest["len"], manifest["build"]["storage"]
        ('list_items', 1, 'ListStorage')
    """
    root = Path(path)
    root.mkdir(parents=True)
    digests = Digests(root)
    layout = layout_of(replay_buffer)
    # A buffer another process writes into (asynchronous collection) waits while it is read:
    # rows, length and write count of one moment, no half-written row.
    with torchrl_compat.writes_held(replay_buffer):
        content = {**(extra or {}), **layout.save(replay_buffer, root, digests)}
        facts = {
            "layout": layout.name,
            "len": len(replay_buffer),
            "write_count": torchrl_compat.write_count(replay_buffer),
        }
    dump_pending_batches(pending_batches, root, digests)
    check_plain_files(root, written=True)
    return write_manifest(
        root,
        {
            **facts,
            "pending_batches": len(pending_batches),
            "build": buffer_build(replay_buffer),
            **content,
        },
        digests if checksums else None,
    )


def load_dump(
    replay_buffer: ReplayBuffer, path: str | os.PathLike, *, verify: Verify = "full"
) -> list[TensorDictBase]:
    """Restore ``replay_buffer`` from a :func:`dump_buffer` directory; return its pending batches.

    The current content of ``replay_buffer`` is replaced. Raises
    :class:`BufferCheckpointError` naming ``path`` when the directory is
    missing, does not match its manifest (``verify``, see
    :func:`~rb_lightning.checkpoint.read_manifest`: checked before the buffer is
    touched), or holds a file that could run code when read (a pickle): nothing
    in it is unpickled. :func:`~rb_lightning.checkpoint.load_buffer` reads a
    Lightning checkpoint or a run directory as well.
    """
    root = Path(path)
    manifest = read_manifest(root, verify=verify)
    check_plain_files(root)
    check_same_build(manifest["build"], replay_buffer, root)
    layout = layout_named(manifest["layout"], root)
    layout.verify(replay_buffer, root, manifest)
    layout.load(replay_buffer, root, manifest)
    if (
        len(replay_buffer) != manifest["len"]
        or torchrl_compat.write_count(replay_buffer) != manifest["write_count"]
    ):
        raise BufferCheckpointError(
            f"Replay buffer loaded from {root} holds {len(replay_buffer)} items (write_count "
            f"{torchrl_compat.write_count(replay_buffer)}), its manifest says {manifest['len']} "
            f"({manifest['write_count']}). {SAME_BUILD_HINT}"
        )
    return [
        TensorDict.load_memmap(root / PENDING_DIR / str(number), allow_pickle=False).clone()
        for number in range(manifest.get("pending_batches", 0))
    ]


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
