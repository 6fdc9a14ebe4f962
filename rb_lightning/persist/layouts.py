"""The layouts of a buffer dump, one class each, keyed by the name the manifest records.

A dump's *layout* is how its files hold the items; each layout saves a buffer's items,
verifies that a buffer can take a dump before touching it, and loads it (only tensors and
JSON, never a pickle). ``list_items``: a ``ListStorage``, one TensorDict per item;
``empty_buffer``: state only; ``filled_rows``: rows ``[0, len)`` of a tensor storage that
has not wrapped; ``whole_storage``: any other tensor storage; ``chunked_rows``: chunks
shared between checkpoints (:mod:`rb_lightning.persist.chunks`); ``torchrl_dumps`` and
``remote_empty``: written by a Ray buffer's actor. :func:`layout_of` picks a buffer's
layout, :func:`layout_named` the one a manifest names.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
    >>> layout_of(rb).name
    'empty_buffer'
    >>> _ = rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    >>> layout_of(rb).name, layout_of(ReplayBuffer(storage=ListStorage(8))).name
    ('filled_rows', 'list_items')
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    TensorStorage,
)

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.chunks import check_chunk_files, load_chunked_rows
from rb_lightning.persist.components import dump_components, load_components, on_host
from rb_lightning.persist.manifest import (
    LIST_DIR,
    STORAGE_DIR,
    TENSOR_ROWS,
    TRANSFORM_STATE,
    Digests,
    Layout,
    not_this_layout,
)
from rb_lightning.persist.mismatch import check_capacity, require_storage, unloadable

__all__ = [
    "LAYOUTS",
    "ActorDump",
    "ActorEmpty",
    "ChunkedRows",
    "DumpLayout",
    "EmptyBuffer",
    "FilledRows",
    "ListItems",
    "WholeStorage",
    "actor_dump_layout",
    "layout_named",
    "layout_of",
    "writes_filled_rows_only",
]

#: Storage types whose filled rows are the whole content (others: written whole by torchrl).
_ROW_STORAGES = (TensorStorage, LazyTensorStorage, LazyMemmapStorage)


class DumpLayout:
    """One way of writing a buffer's items into a dump directory, and of reading them back."""

    #: The name the manifest records (``"layout"``).
    name: ClassVar[Layout]

    def matches(self, replay_buffer: ReplayBuffer) -> bool:
        """Whether :func:`layout_of` saves ``replay_buffer`` in this layout."""
        return False

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        """Write the items and components into ``root``; return what the manifest must record."""
        raise NotImplementedError

    def verify(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        """Raise :class:`BufferCheckpointError` if ``replay_buffer`` cannot take this dump."""

    def load(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        """Replace ``replay_buffer``'s content with the dump in ``root`` (already verified)."""
        raise NotImplementedError


class ListItems(DumpLayout):
    """A ``ListStorage``: one memory-mapped TensorDict per item (tensors and dicts wrapped)."""

    name = "list_items"

    def matches(self, replay_buffer: ReplayBuffer) -> bool:
        return isinstance(replay_buffer.storage, ListStorage)

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        storage = replay_buffer.storage
        item_kinds = []
        for number in range(len(storage)):
            item = storage.get(number)
            if isinstance(item, TensorDictBase):
                item_kinds.append("tensordict")
            elif isinstance(item, torch.Tensor):
                item_kinds.append("tensor")
                item = TensorDict({TENSOR_ROWS: item})
            elif isinstance(item, dict):
                item_kinds.append("dict")
                item = TensorDict(item)
            else:
                shutil.rmtree(root, ignore_errors=True)
                raise BufferCheckpointError(
                    f"ListStorage item {number} is a {type(item).__name__}: rb_lightning "
                    "checkpoints TensorDict, tensor and dict items (stored as tensors and JSON, "
                    "never pickled). Store items as TensorDicts."
                )
            digests.add_written(item.memmap(root / LIST_DIR / str(number)))
        return {
            "capacity": storage.max_size,
            "item_kinds": item_kinds,
            **dump_components(replay_buffer, root, digests),
        }

    def verify(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        require_storage(
            isinstance(replay_buffer.storage, ListStorage), root, "a ListStorage", replay_buffer
        )
        check_capacity(replay_buffer, root, manifest)

    def load(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        storage = replay_buffer.storage
        replay_buffer.empty()
        for number, item_kind in enumerate(manifest["item_kinds"]):
            item = TensorDict.load_memmap(root / LIST_DIR / str(number), allow_pickle=False)
            item = item.clone()  # out of the memmap files, which belong to the checkpoint
            if item_kind == "tensor":
                item = item[TENSOR_ROWS]
            elif item_kind == "dict":
                item = item.to_dict()
            storage.set(number, item)
        load_components(replay_buffer, root, manifest)


class EmptyBuffer(DumpLayout):
    """A buffer without data (torchrl cannot dump a storage that never received any)."""

    name = "empty_buffer"

    def matches(self, replay_buffer: ReplayBuffer) -> bool:
        return not getattr(replay_buffer.storage, "initialized", True) or len(replay_buffer) == 0

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        dump_components(replay_buffer, root, digests)
        return {}

    def load(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        replay_buffer.empty()
        load_components(replay_buffer, root, manifest, sampler=False)


def writes_filled_rows_only(replay_buffer: ReplayBuffer) -> bool:
    """Whether a dump of ``replay_buffer`` holds only its filled rows (layout ``filled_rows``).

    A 1-D tensor storage that has not wrapped (``0 < len < max_size``), with torchrl's default
    checkpointer and no prefetch queue or stateful transform; everything else is written whole.
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


class FilledRows(DumpLayout):
    """Rows ``[0, len)`` of a tensor storage that has not wrapped, as a memory-mapped TensorDict."""

    name = "filled_rows"

    def matches(self, replay_buffer: ReplayBuffer) -> bool:
        return writes_filled_rows_only(replay_buffer)

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        storage = replay_buffer.storage
        rows = storage.get(slice(0, len(storage)))
        tensor_rows = isinstance(rows, torch.Tensor)
        if tensor_rows:
            rows = TensorDict({TENSOR_ROWS: rows}, batch_size=rows.shape[:1])
        rows = on_host(rows)  # a storage on the GPU is saved to host memory-mapped files
        # memmap storages: copy, do not move
        digests.add_written(rows.memmap(root / STORAGE_DIR, copy_existing=True))
        return {
            "capacity": storage.max_size,
            "tensor_rows": tensor_rows,
            **dump_components(replay_buffer, root, digests),
        }

    def verify(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        storage = replay_buffer.storage
        require_storage(isinstance(storage, TensorStorage), root, "a tensor storage", replay_buffer)
        check_capacity(replay_buffer, root, manifest)

    def load(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        storage = replay_buffer.storage
        saved = TensorDict.load_memmap(root / STORAGE_DIR, allow_pickle=False)
        rows = saved[TENSOR_ROWS] if manifest["tensor_rows"] else saved
        try:
            # empty() resets storage length, writer and sampler; set() initialises a lazy
            # storage at the full capacity and counts the rows; then the saved states.
            replay_buffer.empty()
            with torchrl_compat.overwriting_scratch_files(storage):
                storage.set(slice(0, manifest["len"]), rows)
        except Exception as error:
            raise unloadable(root, error, replay_buffer, rows) from error
        load_components(replay_buffer, root, manifest)


class WholeStorage(DumpLayout):
    """A tensor storage written whole by its own checkpointer (memmaps and JSON)."""

    name: ClassVar[Layout] = "whole_storage"  # ActorDump, a subclass, has its own

    def matches(self, replay_buffer: ReplayBuffer) -> bool:
        return True  # the last of LAYOUTS to be tried: what no other layout takes

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        storage = replay_buffer.storage
        with torchrl_compat.ignore_last_cursor_warning():
            storage.dumps(root / STORAGE_DIR)
        # torchrl's checkpointer copies the storage's leaves into storage/<key>.memmap.
        digests.add_source(torchrl_compat.storage_content(storage), root / STORAGE_DIR)
        extra = {"capacity": storage.max_size, **dump_components(replay_buffer, root, digests)}
        transform_state = replay_buffer.transform.state_dict()
        if transform_state:
            torch.save(transform_state, root / TRANSFORM_STATE)  # tensors: weights-only loadable
        return extra

    def verify(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        storage = replay_buffer.storage
        require_storage(isinstance(storage, TensorStorage), root, "a tensor storage", replay_buffer)
        check_capacity(replay_buffer, root, manifest)

    def load(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        try:
            # The storage's checkpointer reads memmaps and JSON; check_plain_files has made
            # sure there is no pickle sidecar for it to read.
            with torchrl_compat.overwriting_scratch_files(replay_buffer.storage):
                replay_buffer.storage.loads(root / STORAGE_DIR)
        except Exception as error:
            raise unloadable(root, error, replay_buffer) from error
        load_components(replay_buffer, root, self.components_record(root, manifest))
        if (root / TRANSFORM_STATE).exists():
            replay_buffer.transform.load_state_dict(
                torch.load(root / TRANSFORM_STATE, weights_only=True)
            )
        torchrl_compat.restore_non_tensor_columns(replay_buffer, root / STORAGE_DIR)

    def components_record(self, root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        """Where the batch size and ``consume_after_n_samples`` were recorded: the manifest."""
        return manifest


class ChunkedRows(DumpLayout):
    """A tensor storage saved in chunks shared between checkpoints; written by :func:`~rb_lightning.persist.chunks.prepare_chunked_save`, never picked by :func:`layout_of`."""

    name = "chunked_rows"

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        raise BufferCheckpointError(
            "A chunked_rows dump is written by rb_lightning.persist.chunks.prepare_chunked_save "
            "(BufferCheckpointIO(incremental=True)), not by dump_buffer."
        )

    def verify(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        storage = replay_buffer.storage
        require_storage(isinstance(storage, TensorStorage), root, "a tensor storage", replay_buffer)
        check_capacity(replay_buffer, root, manifest)
        check_chunk_files(root, manifest)

    def load(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        load_chunked_rows(replay_buffer, root, manifest)


_WRITTEN_BY_ACTOR = (
    "A {name!r} dump is written by a Ray buffer's actor "
    "(rb_lightning.distributed.ray_checkpoint.dump_remote_buffer), not by this process."
)


class ActorDump(WholeStorage):
    """torchrl's own ``dumps`` layout, written by a Ray buffer's actor; read like a whole storage."""

    name = "torchrl_dumps"

    def matches(self, replay_buffer: ReplayBuffer) -> bool:
        return False  # written inside the actor, never chosen for a buffer of this process

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        raise BufferCheckpointError(_WRITTEN_BY_ACTOR.format(name=self.name))

    def components_record(self, root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        # torchrl's dumps records batch size and consume_after_n_samples in its own file.
        metadata = root / "buffer_metadata.json"
        if not metadata.exists():
            return manifest
        return {**manifest, **json.loads(metadata.read_text())}


class ActorEmpty(DumpLayout):
    """A Ray buffer that held no data when saved: nothing but the manifest."""

    name = "remote_empty"

    def save(self, replay_buffer: ReplayBuffer, root: Path, digests: Digests) -> dict[str, Any]:
        raise BufferCheckpointError(_WRITTEN_BY_ACTOR.format(name=self.name))

    def load(self, replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
        replay_buffer.empty()


#: Every layout, by the name a manifest records. :func:`layout_of` tries them in this order.
LAYOUTS: dict[str, DumpLayout] = {
    layout.name: layout
    for layout in (
        ListItems(),
        EmptyBuffer(),
        FilledRows(),
        WholeStorage(),
        ChunkedRows(),
        ActorDump(),
        ActorEmpty(),
    )
}


def layout_of(replay_buffer: ReplayBuffer) -> DumpLayout:
    """The layout ``replay_buffer`` is saved in: the first of :data:`LAYOUTS` that matches it."""
    return next(layout for layout in LAYOUTS.values() if layout.matches(replay_buffer))


def layout_named(name: Any, root: Path) -> DumpLayout:
    """The layout a manifest names; :class:`BufferCheckpointError` for a name of no known one."""
    layout = LAYOUTS.get(name) if isinstance(name, str) else None
    if layout is None:
        raise not_this_layout(root, f"a dump of layout {name!r}")
    return layout


def actor_dump_layout(length: int) -> Layout:
    """The layout of a dump a Ray buffer's actor wrote of ``length`` items."""
    return ActorDump.name if length else ActorEmpty.name
