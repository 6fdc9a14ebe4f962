"""Replay-buffer checkpoints: a buffer saved exactly, inside a Lightning ``.ckpt`` or beside it.

A resumed online RL / RLHF run needs its buffer back exactly: content, writer
cursor and ``write_count``, sampler state (priorities, the without-replacement
permutation) and the sampling generator. The package, by job:

* :mod:`~rb_lightning.checkpoint.dumps`: a buffer to a dump directory and back
  (:func:`dump_buffer`, :func:`load_dump`): memory-mapped tensors and JSON, never a pickle;
* :mod:`~rb_lightning.checkpoint.kinds`: one class per kind of dump (by storage),
  in one table keyed by the name the manifest records; what every kind holds
  besides the items (sampler, writer, generator) is
  :mod:`~rb_lightning.checkpoint.components`, the errors for a buffer that cannot
  take a dump :mod:`~rb_lightning.checkpoint.mismatch`;
* :mod:`~rb_lightning.checkpoint.manifest`: the manifest (format version, sizes
  and ``xxh3_64`` checksums of every file) and its verification;
  :mod:`~rb_lightning.checkpoint.build`: the buffer's build it records, and the check
  that a resumed buffer matches;
* :mod:`~rb_lightning.checkpoint.files`: atomic versions (``fsync`` and rename),
  disk-space checks, cleanup of what a dead save left, packing into one tensor;
* :mod:`~rb_lightning.checkpoint.state` and :mod:`~rb_lightning.checkpoint.io`:
  what a DataModule stores in its ``state_dict`` (small buffers packed inside the
  ``.ckpt``, larger ones written beside it as ``<ckpt>.buffer/<version>/`` by
  :class:`BufferCheckpointIO`, before the ``.ckpt`` and removed with it;
  :mod:`~rb_lightning.checkpoint.beside` holds the requests and references);
* :mod:`~rb_lightning.checkpoint.chunks`: chunked saves (``BufferCheckpointIO(incremental=True)``):
  each save writes the rows written since the previous one as chunks shared by the
  checkpoints of a directory, a manifest lists the chunks that make up the buffer, and
  chunks no kept checkpoint lists are deleted; :mod:`~rb_lightning.checkpoint.background_save`
  is the one writer thread that finishes such saves while training goes on;
* :mod:`~rb_lightning.checkpoint.load`: reading a saved buffer back from a
  dump, a ``.ckpt`` or a run directory (:func:`load_buffer`);
* :mod:`~rb_lightning.checkpoint.elastic`: per-rank buffers of a DDP run resumed on
  another number of ranks, every saved item dealt to exactly one of them;
* :mod:`~rb_lightning.checkpoint.adapter`: a dump as a component of a
  ``torchrl.checkpoint.Checkpoint`` (:class:`BufferCheckpointAdapter`).

A Ray buffer is saved by its actor (:mod:`rb_lightning.distributed.ray_checkpoint`; its
names are importable from here, and import it on first use). The format is
version 1 until rb_lightning's first release: a dump of an earlier, unreleased
layout is refused with a :class:`BufferCheckpointError` saying so. A missing or
damaged buffer raises :class:`BufferCheckpointError` naming the path, never a
silently empty buffer; a dump that would not fit the disk raises
:class:`NotEnoughDiskSpaceError` before anything is written.

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
    >>> restored[:]["x"].tolist(), restored.write_count
    ([0, 1, 2, 3], 4)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rb_lightning.errors import BufferCheckpointError, NotEnoughDiskSpaceError
from rb_lightning.namespaces import lazy_names

if TYPE_CHECKING:  # pragma: no cover
    from rb_lightning.distributed.ray_checkpoint import (
        RemoteDumpRequest,
        dump_remote_buffer,
        load_remote_buffer,
        remote_buffer_state,
        restore_remote_buffer_state,
    )

    from .adapter import BufferCheckpointAdapter
    from .beside import (
        BUFFER_DIR_SUFFIX,
        BufferDumpRequest,
        RankDumpsRequest,
        buffer_dir_for,
        resolve_reference,
        staging_dir_for,
    )
    from .build import buffer_build, check_same_build
    from .components import ensure_generator
    from .dumps import buffer_nbytes, dump_buffer, dump_nbytes, load_dump
    from .files import (
        check_disk_space,
        free_disk_bytes,
        pack_directory,
        publish_version,
        remove_stale_versions,
        sync_path,
        unpack_directory,
        write_version,
    )
    from .io import BufferCheckpointIO, install_checkpoint_io
    from .kinds import writes_filled_rows_only
    from .load import (
        checkpoint_buffer_state,
        checkpoint_dumps,
        checkpoint_path_of,
        load_buffer,
        read_torch_file,
    )
    from .manifest import (
        FORMAT_VERSION,
        MANIFEST,
        VERIFY_MODES,
        Verify,
        check_verify_mode,
        read_manifest,
    )
    from .state import (
        DEFAULT_INLINE_MAX_BYTES,
        buffer_state,
        mixture_state,
        rank_buffer_state,
        restore_buffer_state,
        restore_mixture_state,
    )

#: Public name -> the module that defines it: imported on first use, so importing one
#: module of the package (the buffer handles import .state) does not import them all.
_HOMES = {
    "BUFFER_DIR_SUFFIX": "rb_lightning.checkpoint.beside",
    "BufferCheckpointAdapter": "rb_lightning.checkpoint.adapter",
    "BufferCheckpointIO": "rb_lightning.checkpoint.io",
    "BufferDumpRequest": "rb_lightning.checkpoint.beside",
    "DEFAULT_INLINE_MAX_BYTES": "rb_lightning.checkpoint.state",
    "FORMAT_VERSION": "rb_lightning.checkpoint.manifest",
    "MANIFEST": "rb_lightning.checkpoint.manifest",
    "RankDumpsRequest": "rb_lightning.checkpoint.beside",
    "VERIFY_MODES": "rb_lightning.checkpoint.manifest",
    "Verify": "rb_lightning.checkpoint.manifest",
    "buffer_build": "rb_lightning.checkpoint.build",
    "buffer_dir_for": "rb_lightning.checkpoint.beside",
    "buffer_nbytes": "rb_lightning.checkpoint.dumps",
    "buffer_state": "rb_lightning.checkpoint.state",
    "check_disk_space": "rb_lightning.checkpoint.files",
    "check_same_build": "rb_lightning.checkpoint.build",
    "check_verify_mode": "rb_lightning.checkpoint.manifest",
    "checkpoint_buffer_state": "rb_lightning.checkpoint.load",
    "checkpoint_dumps": "rb_lightning.checkpoint.load",
    "checkpoint_path_of": "rb_lightning.checkpoint.load",
    "dump_buffer": "rb_lightning.checkpoint.dumps",
    "dump_nbytes": "rb_lightning.checkpoint.dumps",
    "ensure_generator": "rb_lightning.checkpoint.components",
    "free_disk_bytes": "rb_lightning.checkpoint.files",
    "install_checkpoint_io": "rb_lightning.checkpoint.io",
    "load_buffer": "rb_lightning.checkpoint.load",
    "load_dump": "rb_lightning.checkpoint.dumps",
    "mixture_state": "rb_lightning.checkpoint.state",
    "pack_directory": "rb_lightning.checkpoint.files",
    "publish_version": "rb_lightning.checkpoint.files",
    "rank_buffer_state": "rb_lightning.checkpoint.state",
    "read_manifest": "rb_lightning.checkpoint.manifest",
    "read_torch_file": "rb_lightning.checkpoint.load",
    "remove_stale_versions": "rb_lightning.checkpoint.files",
    "resolve_reference": "rb_lightning.checkpoint.beside",
    "restore_buffer_state": "rb_lightning.checkpoint.state",
    "restore_mixture_state": "rb_lightning.checkpoint.state",
    "staging_dir_for": "rb_lightning.checkpoint.beside",
    "sync_path": "rb_lightning.checkpoint.files",
    "unpack_directory": "rb_lightning.checkpoint.files",
    "write_version": "rb_lightning.checkpoint.files",
    "writes_filled_rows_only": "rb_lightning.checkpoint.kinds",
}

#: A Ray buffer's checkpoint names, defined in rb_lightning.distributed.ray_checkpoint (imported on use).
_RAY_NAMES = (
    "RemoteDumpRequest",
    "dump_remote_buffer",
    "load_remote_buffer",
    "remote_buffer_state",
    "restore_remote_buffer_state",
)

__all__ = [
    "BUFFER_DIR_SUFFIX",
    "DEFAULT_INLINE_MAX_BYTES",
    "FORMAT_VERSION",
    "MANIFEST",
    "VERIFY_MODES",
    "BufferCheckpointAdapter",
    "BufferCheckpointError",
    "BufferCheckpointIO",
    "BufferDumpRequest",
    "NotEnoughDiskSpaceError",
    "RankDumpsRequest",
    "RemoteDumpRequest",
    "Verify",
    "buffer_build",
    "buffer_dir_for",
    "buffer_nbytes",
    "buffer_state",
    "check_disk_space",
    "check_same_build",
    "check_verify_mode",
    "checkpoint_buffer_state",
    "checkpoint_dumps",
    "checkpoint_path_of",
    "dump_buffer",
    "dump_nbytes",
    "dump_remote_buffer",
    "ensure_generator",
    "free_disk_bytes",
    "install_checkpoint_io",
    "load_buffer",
    "load_dump",
    "load_remote_buffer",
    "mixture_state",
    "pack_directory",
    "publish_version",
    "rank_buffer_state",
    "read_manifest",
    "read_torch_file",
    "remote_buffer_state",
    "remove_stale_versions",
    "resolve_reference",
    "restore_buffer_state",
    "restore_mixture_state",
    "restore_remote_buffer_state",
    "staging_dir_for",
    "sync_path",
    "unpack_directory",
    "write_version",
    "writes_filled_rows_only",
]


_HOMES.update(dict.fromkeys(_RAY_NAMES, "rb_lightning.distributed.ray_checkpoint"))
__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
