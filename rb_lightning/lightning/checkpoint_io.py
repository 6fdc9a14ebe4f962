"""Lightning's ``CheckpointIO`` for replay buffers: dumps beside the ``.ckpt``, written and removed with it.

:class:`BufferCheckpointIO` wraps the Trainer's ``CheckpointIO``: it writes the dumps a
checkpoint requests to ``<ckpt>.buffer/<version>/``, writes the ``.ckpt`` and renames it
into place, and only then deletes older buffer versions. With ``incremental=True`` a tensor
buffer is saved in chunks (:mod:`~rb_lightning.persist.chunks`) by a writer thread while
training goes on. :func:`install_checkpoint_io` puts it on a Trainer's strategy, once.

Examples:
    >>> from lightning.pytorch import Trainer
    >>> trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    >>> install_checkpoint_io(trainer)
    >>> install_checkpoint_io(trainer)  # idempotent
    >>> type(trainer.strategy.checkpoint_io).__name__
    'BufferCheckpointIO'
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from rb_lightning.errors import UsageError
from rb_lightning.persist.background_save import BackgroundWriter
from rb_lightning.persist.beside import (
    BUFFER_DIR_SUFFIX,
    BufferDumpRequest,
    beside_reference,
    buffer_dir_for,
)
from rb_lightning.persist.chunks import (
    ChunkedSave,
    chunked_save_supported,
    collect_garbage,
    prepare_chunked_save,
)
from rb_lightning.persist.files import remove_stale_versions, sync_path
from rb_lightning.persist.manifest import CHUNKS_DIR
from rb_lightning.persist.record import resolve_records_in

__all__ = ["STREAM_STATE_TAG", "WEIGHTS_ONLY_STATE", "BufferCheckpointIO", "install_checkpoint_io"]

_PARTIAL_PREFIX = ".rb_lightning-partial-"  # a .ckpt being written, renamed into place

#: Marks a DataModule's state in a checkpoint dict, so that a weights-only save can drop it.
STREAM_STATE_TAG = "rb_lightning_stream"
#: What a weights-only checkpoint holds in place of a DataModule's state.
WEIGHTS_ONLY_STATE: dict[str, Any] = {STREAM_STATE_TAG: True, "weights_only": True}

#: Key of the save's number in the checkpoint dict, from :class:`BufferCheckpointIO` to
#: the writer that commits it; removed before the ``.ckpt`` is written.
_SAVE_KEY = "rb_lightning_save"


class _SaveLedger:
    """Saves handed to the ``.ckpt`` writer, and what each makes obsolete once it is written.

    The writer (this thread or ``AsyncCheckpointIO``'s) writes saves in order and calls
    :meth:`finish` after each; only then are older versions deleted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._submitted = 0
        self._finished = 0
        self._obsolete: dict[int, list[Path]] = {}
        self._removals: list[tuple[int, Callable[[], None]]] = []
        # Saves whose finish() has returned, deletions included (for wait_for).
        self._ended = 0
        self._ended_changed = threading.Condition()

    def wait_for(self, number: int) -> None:
        """Block until save ``number`` has ended, with what it deleted (maybe in another thread)."""
        with self._ended_changed:
            self._ended_changed.wait_for(lambda: self._ended >= number)

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
        """Save ``number`` ended: delete what it made obsolete (if ``written``), run due removals (a failed save deletes nothing)."""
        with self._lock:
            if number is None:  # a checkpoint that did not come through BufferCheckpointIO
                return
            obsolete = self._obsolete.pop(number, [])
            self._finished = max(self._finished, number)
            due = [removal for after, removal in self._removals if after <= number]
            self._removals = [entry for entry in self._removals if entry[0] > number]
        try:
            if not written:
                return
            for entry in obsolete:
                shutil.rmtree(entry, ignore_errors=True)
            for removal in due:
                removal()
        finally:
            with self._ended_changed:
                self._ended = max(self._ended, number)
                self._ended_changed.notify_all()


class _CommitAfterWrite(CheckpointIO):
    """Writes the ``.ckpt`` with ``checkpoint_io``, then finishes the save in the ledger (in ``AsyncCheckpointIO``'s thread, or this one)."""

    def __init__(self, checkpoint_io: CheckpointIO, ledger: _SaveLedger) -> None:
        self.checkpoint_io, self.ledger = checkpoint_io, ledger

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        number = checkpoint.pop(_SAVE_KEY, None)
        try:
            _write_in_place(self.checkpoint_io, checkpoint, path, storage_options)
        except BaseException:
            self.ledger.finish(number, written=False)
            raise
        self.ledger.finish(number, written=True)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return self.checkpoint_io.load_checkpoint(
            path, map_location=map_location, **_weights_only(weights_only)
        )

    def remove_checkpoint(self, path: Any) -> None:
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        self.checkpoint_io.teardown()


def _write_in_place(
    checkpoint_io: CheckpointIO, checkpoint: dict[str, Any], path: Any, storage_options: Any
) -> None:
    """Write a local ``.ckpt`` beside its final place, ``fsync`` it, rename it over ``path``.

    Lightning stages in the system temporary directory, and a move across filesystems is a
    copy a kill can truncate; here one ``os.replace`` on the same filesystem. Remote paths
    are written by ``checkpoint_io`` as they are.
    """
    if "://" in str(path) and not str(path).startswith("file://"):
        checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
        return
    final = Path(str(path).removeprefix("file://"))
    final.parent.mkdir(parents=True, exist_ok=True)
    # Only this thread writes .ckpt files of the run (AsyncCheckpointIO has one writer),
    # so a partial directory found now belongs to a save that died.
    for stale in final.parent.glob(f"{_PARTIAL_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = final.parent / f"{_PARTIAL_PREFIX}{uuid.uuid4().hex}"
    partial.mkdir()
    try:
        checkpoint_io.save_checkpoint(
            checkpoint, partial / final.name, storage_options=storage_options
        )
        sync_path(partial / final.name)
        os.replace(partial / final.name, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    sync_path(final.parent, recursive=False)


class BufferCheckpointIO(CheckpointIO):
    """A ``CheckpointIO`` that writes large replay buffers beside the checkpoint file.

    It wraps another ``CheckpointIO`` (default: ``TorchCheckpointIO``): for each
    :class:`BufferDumpRequest` in the checkpoint it dumps to ``<ckpt>.buffer/<version>``, saves
    the ``.ckpt``, then deletes older versions; ``remove_checkpoint`` removes the buffer too.
    With ``AsyncCheckpointIO`` the buffer is still dumped in the training thread; the newest
    complete ``.ckpt`` always has its buffer on disk. A weights-only save keeps no buffer
    (:data:`WEIGHTS_ONLY_STATE`).

    ``incremental=True`` saves a tensor buffer in chunks shared by the directory's
    checkpoints (only the rows written since the previous save); with ``background=True``
    the training thread only copies them and a writer thread writes chunks, manifest and
    ``.ckpt`` (the next save, a load or the end of ``fit`` waits for it and raises its error).
    Chunks no kept checkpoint lists are deleted. The DataModule installs it when needed; pass
    it as ``Trainer(plugins=[...])`` to wrap a custom ``CheckpointIO``.

    Examples:
        >>> BufferCheckpointIO(incremental=True).incremental  # Trainer(plugins=[...])
        True
    """

    def __init__(
        self,
        checkpoint_io: CheckpointIO | None = None,
        *,
        incremental: bool = False,
        background: bool = True,
    ) -> None:
        for name, value in (("incremental", incremental), ("background", background)):
            if not isinstance(value, bool):
                raise UsageError(
                    name,
                    f"BufferCheckpointIO({name}={value!r}): {name} is True or False "
                    "(incremental=True: chunked saves of what changed; background=True: "
                    "written by a writer thread). Pass a bool.",
                )
        self.incremental = incremental
        self._writer = BackgroundWriter() if incremental and background else None
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
        if self._writer is not None:
            self._writer.wait()  # saves do not overlap: the previous one (and its deletions) ends
        if "optimizer_states" not in checkpoint:
            # save_weights_only=True (Lightning leaves out the optimizers, loops' callbacks and
            # all that resuming needs): the user asked for the weights, not the buffer.
            _drop_stream_states(checkpoint)
        directory = buffer_dir_for(path)
        # Leftovers of saves that died, beside any checkpoint of this directory
        # (each .ckpt has its own <ckpt>.buffer/, and the next save has a new name).
        # Dumps are made in this thread, so no .tmp here belongs to a live save.
        for buffer_dir in directory.parent.glob(f"*{BUFFER_DIR_SUFFIX}"):
            remove_stale_versions(buffer_dir)
        if (
            self.incremental
            and _is_local(path)
            and self._save_chunked(checkpoint, path, storage_options, directory)
        ):
            return
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

    def _save_chunked(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any, directory: Path
    ) -> bool:
        """Save ``checkpoint`` with its tensor buffers in chunks; ``False``: it has none."""
        if not any(_chunkable(request) for _, _, request in _find_requests(checkpoint)):
            return False
        if self._writer is not None:
            # The checkpoint holds the live model and optimizer tensors: copy them now, before
            # training changes them (as AsyncCheckpointIO does). Requests are kept as they are.
            checkpoint = apply_to_collection(checkpoint, torch.Tensor, _cloned)
        prepared: list[tuple[dict[str, Any], str, ChunkedSave]] = []
        written: list[str] = []
        try:
            for holder, key, request in _find_requests(checkpoint):
                if _chunkable(request):
                    save = prepare_chunked_save(
                        request.replay_buffer,
                        directory,
                        pending_batches=request.pending_batches,
                        extra=request.extra,
                    )
                    prepared.append((holder, key, save))
                else:
                    holder[key] = reference = request.write(directory)
                    written.append(reference["version"])
        except BaseException:
            for _, _, save in prepared:
                save.abandon()
            raise
        obsolete: list[Path] = []  # filled once the chunked versions are published
        number = self._ledger.submit(obsolete)

        def finish() -> None:
            try:
                for holder, key, save in prepared:
                    version, manifest = save.finish()
                    holder[key] = beside_reference(directory, version, manifest)
                    written.append(version)
            except BaseException:
                for _, _, save in prepared:
                    save.abandon()
                self._ledger.finish(number, written=False)
                raise
            obsolete.extend(entry for entry in directory.iterdir() if entry.name not in written)
            checkpoint[_SAVE_KEY] = number
            self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)
            # With AsyncCheckpointIO below, the .ckpt is written in its thread: wait for it
            # (and for the deletions it makes due) before chunks are collected.
            self._ledger.wait_for(number)
            _collect_chunks(directory.parent)

        if self._writer is not None:
            self._writer.submit(finish)
        else:
            finish()
        return True

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if self._writer is not None:
            self._writer.wait()  # a checkpoint this process is still writing
        checkpoint = self.checkpoint_io.load_checkpoint(
            path, map_location=map_location, **_weights_only(weights_only)
        )
        checkpoint.pop(_SAVE_KEY, None)
        resolve_records_in(checkpoint, path)
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        """Remove ``path`` and its buffer, after the saves still being written (async IO)."""

        def remove() -> None:
            self.checkpoint_io.remove_checkpoint(path)
            shutil.rmtree(str(path) + BUFFER_DIR_SUFFIX, ignore_errors=True)
            if _is_local(path):
                _collect_chunks(Path(str(path).removeprefix("file://")).parent)

        if not self._ledger.defer(remove):
            remove()

    def teardown(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()  # the save under way is finished; its error raised here
        finally:
            self.checkpoint_io.teardown()


def _is_local(path: Any) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def _chunkable(request: Any) -> bool:
    # A buffer of this process only (not a DDP rank set or a Ray actor's dump request).
    return type(request) is BufferDumpRequest and chunked_save_supported(request.replay_buffer)


def _cloned(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _collect_chunks(checkpoint_dir: Path) -> None:
    """Delete the chunks of ``checkpoint_dir`` that no kept checkpoint's buffer lists (a ``.buffer`` without its ``.ckpt`` is not kept)."""
    store = checkpoint_dir / CHUNKS_DIR
    if not store.is_dir():
        return
    versions = [
        version
        for buffer_dir in checkpoint_dir.glob(f"*{BUFFER_DIR_SUFFIX}")
        if (checkpoint_dir / buffer_dir.name.removesuffix(BUFFER_DIR_SUFFIX)).exists()
        for version in buffer_dir.iterdir()
    ]
    collect_garbage(store, versions)


def _drop_stream_states(checkpoint: dict[str, Any]) -> None:
    for key, value in checkpoint.items():
        if isinstance(value, dict) and value.get(STREAM_STATE_TAG):
            checkpoint[key] = dict(WEIGHTS_ONLY_STATE)


def _weights_only(weights_only: bool | None) -> dict[str, bool]:
    # Passed on only when given: a wrapped CheckpointIO written for an older Lightning
    # may not take the argument.
    return {} if weights_only is None else {"weights_only": weights_only}


def install_checkpoint_io(trainer: Any) -> None:
    """Wrap ``trainer.strategy.checkpoint_io`` in :class:`BufferCheckpointIO`, once (idempotent; ``trainer=None`` does nothing)."""
    strategy = getattr(trainer, "strategy", None)
    if strategy is None or isinstance(strategy.checkpoint_io, BufferCheckpointIO):
        return
    strategy.checkpoint_io = BufferCheckpointIO(strategy.checkpoint_io)


def _nested_dicts(checkpoint: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The dicts inside ``checkpoint``, at any depth (a mixture nests one state per member)."""
    for value in checkpoint.values():
        if isinstance(value, dict):
            yield value
            yield from _nested_dicts(value)


def _find_requests(checkpoint: dict[str, Any]) -> list[tuple[dict[str, Any], str, Any]]:
    found = []
    for value in _nested_dicts(checkpoint):
        found += [(value, k, v) for k, v in value.items() if isinstance(v, BufferDumpRequest)]
    return found
