"""Features built on torchrl 0.14.1 / tensordict 0.14.3 internals: their private names.

torchrl has no public accessor for these (a storage's rows, a writer's cursor, a sampler's
trees, a Ray buffer's actor); each function names what it reads, so that moving the pin
means re-checking this module. No module outside :mod:`rb_lightning.torchrl_compat` touches
a torchrl or tensordict ``_private`` name (``tests/unit/test_private_names.py``).

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(6)}, batch_size=[6]))
    >>> write_count(rb), write_cursor(rb)
    (6, 2)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer, RoundRobinWriter
from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer
from torchrl.data.replay_buffers.storages import Storage

__all__ = [
    "GENERATION_KEY",
    "SAMPLER_SETTINGS",
    "bind_ray_actor",
    "buffer_generator",
    "buffer_lock",
    "can_share_writes",
    "consume_after_n_samples",
    "default_batch_size",
    "direct_sample",
    "direct_sampling_ready",
    "has_custom_checkpointer_hooks",
    "has_prefetch",
    "non_tensor_value",
    "only_view_attached",
    "priority_tree_readers",
    "ray_buffer_actor",
    "restart_permutation",
    "ring_position",
    "sampler_attribute",
    "set_consume_after_n_samples",
    "set_default_batch_size",
    "set_known_column",
    "set_priority_tree",
    "sets_sampler_info",
    "slot_stamps",
    "stop_sharing_writes",
    "storage_content",
    "supports_direct_sampling",
    "unbind_ray_actor",
    "without_generator",
    "write_count",
    "write_cursor",
    "writer_view",
    "writes_held",
]


# -- private attributes (torchrl 0.14.1 has no public accessor) ----------------------------------
def storage_content(storage: Storage) -> Any:
    """The object a storage keeps its items in (``storage._storage``): a TensorDict / tensor (``None`` before a lazy one's first write) or a list."""
    return getattr(storage, "_storage", None)


def write_count(replay_buffer: ReplayBuffer) -> int | None:
    """Items written to ``replay_buffer`` since it was built (``writer._write_count``)."""
    return getattr(replay_buffer.writer, "_write_count", None)


def write_cursor(replay_buffer: ReplayBuffer) -> int:
    """Where a ``RoundRobinWriter`` writes next (``writer._cursor``): a full buffer's oldest item."""
    return int(replay_buffer.writer._cursor)


def set_priority_tree(
    sampler: Any, index: torch.Tensor, values: torch.Tensor, max_priority: float | None
) -> None:
    """Write tree values (already ``(priority + eps) ** alpha``) of ``sampler``'s slots ``index``.

    ``update_priority`` would apply the transform again (and inverting it loses precision), so
    the trees take the saved values as they are and ``_max_priority`` the raw maximum.
    """
    if len(index) == 0:
        return
    device = sampler.device
    index, values = index.to(device), values.to(device=device, dtype=sampler.dtype)
    sampler._sum_tree[index] = values
    sampler._min_tree[index] = values
    if max_priority is not None:
        sampler._max_priority = (max_priority, int(index[values.argmax()]))
    if getattr(sampler, "_max_priority_within_buffer", False):
        sampler._recompute_max_priority_from_tree()


def priority_tree_readers() -> tuple[
    Callable[[Any, int], tuple[float, float] | None], Callable[[Any, Any], torch.Tensor | None]
]:
    """``(mass, stored)``: readers of a ``PrioritizedSampler``'s sum and min trees.

    ``mass(sampler, n)``: sum and minimum of the first ``n`` slots' tree values;
    ``stored(sampler, index)``: the values at ``index`` (float64); ``None`` without trees. Made
    inside this function so cloudpickle sends them by value (a Ray shard needs torchrl only).
    """

    def mass(sampler: Any, n: int) -> tuple[float, float] | None:
        if getattr(sampler, "_sum_tree", None) is None:
            return None
        return float(sampler._sum_tree.query(0, n)), float(sampler._min_tree.query(0, n))

    def stored(sampler: Any, index: Any) -> torch.Tensor | None:
        tree = getattr(sampler, "_sum_tree", None)
        return None if tree is None else torch.as_tensor(tree[index], dtype=torch.double)

    return mass, stored


def has_custom_checkpointer_hooks(storage: Storage) -> bool:
    """Whether ``storage`` uses a checkpointer other than torchrl's default, or hooks on it (only then do they change a dump)."""
    checkpointer = storage.checkpointer
    return (
        type(checkpointer) is not TensorStorageCheckpointer
        or bool(checkpointer._save_hooks)
        or bool(checkpointer._load_hooks)
    )


def has_prefetch(replay_buffer: ReplayBuffer) -> bool:
    """Whether ``replay_buffer`` samples ahead in threads (``ReplayBuffer(prefetch=n)``)."""
    return bool(getattr(replay_buffer, "_prefetch", False))


def buffer_generator(component: Any) -> torch.Generator | None:
    """The ``torch.Generator`` ``rb.set_rng`` gave a buffer or its sampler (``_rng``)."""
    return getattr(component, "_rng", None)


@contextlib.contextmanager
def without_generator(replay_buffer: ReplayBuffer) -> Iterator[None]:
    """Detach the buffer's own reference to its generator for the duration of the block.

    ``set_rng(None)`` would clear the storage's, sampler's and writer's too; only the buffer's is pickled.
    """
    generator = buffer_generator(replay_buffer)
    replay_buffer._rng = None
    try:
        yield
    finally:
        replay_buffer._rng = generator


def default_batch_size(replay_buffer: ReplayBuffer) -> int | None:
    """The ``batch_size`` given to ``ReplayBuffer(batch_size=...)`` (``rb._batch_size``)."""
    return getattr(replay_buffer, "_batch_size", None)


def set_default_batch_size(replay_buffer: ReplayBuffer, batch_size: int) -> None:
    """Set the buffer's default ``batch_size`` (no public setter in torchrl 0.14.1)."""
    if hasattr(replay_buffer, "_batch_size"):
        replay_buffer._batch_size = batch_size


def consume_after_n_samples(replay_buffer: ReplayBuffer) -> int | None:
    """``ReplayBuffer(consume_after_n_samples=...)`` of ``replay_buffer``."""
    return getattr(replay_buffer, "_consume_after_n_samples", None)


def set_consume_after_n_samples(replay_buffer: ReplayBuffer, value: int | None) -> None:
    """Set ``consume_after_n_samples`` (no public setter in torchrl 0.14.1)."""
    if hasattr(replay_buffer, "_consume_after_n_samples"):
        replay_buffer._consume_after_n_samples = value


#: Sampler settings that change which items are drawn or the weights they carry: the
#: attribute torchrl 0.14.1 keeps each in (most are private), and the constructor argument.
#: Plain names so that a Ray buffer's actor, which has torchrl only, can read them too.
SAMPLER_SETTINGS: dict[str, str] = {
    "_alpha": "alpha",
    "_beta": "beta",
    "_eps": "eps",
    "_max_capacity": "max_capacity",
    "drop_last": "drop_last",
    "shuffle": "shuffle",
    "group_size": "group_size",  # rb_lightning.llm.groups.GroupSampler
    "max_staleness": "max_staleness",  # GroupSampler's too; recorded, not compared on resume
    "order": "order",  # GroupSampler's too; recorded, not compared on resume
    "group_key": "group_key",  # GroupSampler's column names
    "version_key": "version_key",
}


def sampler_attribute(sampler: Any, name: str) -> Any:
    """The sampler setting given as ``name`` to its constructor, or ``None`` (``eps`` and ``max_capacity`` are private in 0.14.1)."""
    attribute = {arg: attr for attr, arg in SAMPLER_SETTINGS.items()}.get(name, name)
    return getattr(sampler, attribute, None)


def restart_permutation(sampler: Any) -> None:
    """Make a ``SamplerWithoutReplacement``'s next draw start a new permutation (its private ``_sample_list``)."""
    sampler.load_state_dict(
        {**sampler.state_dict(), "_sample_list": None, "len_storage": 0, "_ran_out": False}
    )


def ray_buffer_actor(replay_buffer: Any) -> Any:
    """The Ray actor handle of a ``RayReplayBuffer`` (``rb._rb``), ``None`` once closed."""
    return getattr(replay_buffer, "_rb", None)


def bind_ray_actor(replay_buffer: Any, actor: Any) -> None:
    """Make a ``RayReplayBuffer`` built without its ``__init__`` a client of a running ``actor``.

    torchrl 0.14.1's ``__init__`` always starts a new actor; these are the attributes it sets
    for the ``"ray"`` transport.
    """
    from torchrl.data.replay_buffers.ray_buffer import _RayReplayBufferClient

    replay_buffer._rb, replay_buffer.has_gpu, replay_buffer._delayed_init = actor, False, False
    replay_buffer._transport_kind = "ray"
    replay_buffer._client = _RayReplayBufferClient(actor, has_gpu=False)


def unbind_ray_actor(replay_buffer: Any) -> None:
    """Drop a ``RayReplayBuffer``'s reference to its actor (``is_alive`` turns false), not kill it."""
    replay_buffer.__dict__.pop("_rb", None)


# -- torchrl 0.14.1: has a slot been written since an item was drawn from it? -------------------
#: The sample column with each slot's write stamp (torchrl's name, from a writer tracking
#: generations; a ``BufferMixture`` fills it for round-robin writers too).
GENERATION_KEY = "index_generation"


def ring_position(replay_buffer: ReplayBuffer) -> tuple[int, int, int] | None:
    """``(write_count, cursor, capacity)`` of a round-robin writer, ``None`` for any other writer.

    Read in that order: ``extend`` moves the cursor before it counts the write, so a write
    between the two reads makes every stamp differ (an update dropped), never match.
    """
    writer, storage = replay_buffer.writer, replay_buffer.storage
    capacity = getattr(storage, "max_size", None)
    if (
        not isinstance(writer, RoundRobinWriter)
        or not isinstance(capacity, int)
        or getattr(storage, "ndim", 1) != 1
    ):
        return None
    written = int(writer._write_count)
    return written, int(writer._cursor), capacity


def slot_stamps(position: tuple[int, int, int], index: torch.Tensor) -> torch.Tensor:
    """For each slot of ``index``, the number of the write that last filled it, at
    ``position`` (:func:`ring_position`): the slot ``d`` places behind the cursor was
    written by write ``write_count - 1 - d``. A later write to the slot changes its
    stamp, writes to other slots do not (the cursor and the count move together).

    Examples:
        >>> slot_stamps((10, 2, 4), torch.tensor([0, 1, 2, 3]))  # 10 writes round 4 slots
        tensor([8, 9, 6, 7])
    """
    written, cursor, capacity = position
    index = torch.as_tensor(index, dtype=torch.long)
    return written - 1 - torch.remainder(cursor - 1 - index, capacity)


def buffer_lock(replay_buffer: ReplayBuffer) -> contextlib.AbstractContextManager[Any]:
    """The lock ``extend``, ``sample`` and ``update_priority`` hold in this process
    (``_replay_lock``, re-entrant): no write of another thread lands while it is held."""
    lock = getattr(replay_buffer, "_replay_lock", None)
    return contextlib.nullcontext() if lock is None else lock


# -- torchrl 0.14: when rb.sample(B, return_info=True) is sampler + storage read -----------------
# ReplayBuffer.sample also runs a prefetch queue, pinning, sample units, collate and
# transforms, and tree-maps the info onto the storage device (~25 us on a ~100 us sample);
# TensorDictReplayBuffer.sample then sets the info on the batch key by key (~100 us of a
# ~300 us draw of 128 CartPole transitions).
# None of these applies to a plain buffer over a CPU tensor storage; then the stream calls
# the sampler and the storage itself. The checks read torchrl 0.14 private attributes:
# re-check them when the pin moves.
def supports_direct_sampling(replay_buffer: ReplayBuffer) -> bool:
    """Whether ``rb.sample`` of this buffer is exactly ``storage.get(sampler.sample(...))``.

    A ``ReplayBuffer`` or ``TensorDictReplayBuffer`` with a ``PrioritizedSampler`` over a 1-D CPU
    ``TensorStorage``, default collate, and no transform, prefetch, pinning, sample unit or
    generation tracking. Anything else takes ``rb.sample``.
    """
    from torchrl.data import PrioritizedSampler, TensorDictReplayBuffer, TensorStorage
    from torchrl.data.replay_buffers.storages import _get_default_collate

    rb = replay_buffer
    # Exact types: a Ray buffer, a prioritized TensorDict buffer... are subclasses.
    if type(rb) not in (ReplayBuffer, TensorDictReplayBuffer) or not rb.initialized:
        return False
    storage = rb.storage
    transform = rb.transform
    return (
        type(rb.sampler) is PrioritizedSampler
        and isinstance(storage, TensorStorage)
        and storage.ndim == 1
        and torch.device(storage.device) == torch.device("cpu")
        and rb._collate_fn is _get_default_collate(storage)
        and (transform is None or len(transform) == 0)
        and not rb._prefetch
        and not rb._pin_memory
        and rb._sample_unit is None
        and not (type(rb) is TensorDictReplayBuffer and rb._writer.tracks_generations)
    )


def sets_sampler_info(replay_buffer: ReplayBuffer) -> bool:
    """Whether ``rb.sample`` itself writes the sampler's info onto the batch (a ``TensorDictReplayBuffer`` does, over stored keys)."""
    from torchrl.data import TensorDictReplayBuffer

    return isinstance(replay_buffer, TensorDictReplayBuffer)


def direct_sampling_ready(replay_buffer: ReplayBuffer) -> bool:
    """Per draw: no pending asynchronous priority update that ``rb.sample`` would wait for."""
    return replay_buffer._sample_dependency is None and replay_buffer.is_alive


def direct_sample(replay_buffer: ReplayBuffer, batch_size: int) -> tuple[torch.Tensor, Any, Any]:
    """``(index, info, items)``: the sampler's draw and the storage read, under ``rb.sample``'s two locks (taken directly: ~1.3 us a batch less)."""
    rb = replay_buffer
    with rb._replay_lock, rb._write_lock:
        index, info = rb._sampler.sample(rb._storage, batch_size)
        return index, info, rb._storage.get(index)


def set_known_column(batch: TensorDictBase, key: str, value: torch.Tensor) -> None:
    """``batch.set(key, value)`` for a value known to fit; skips a plain TensorDict's per-``set`` validation (~0.2 us instead of ~2 us)."""
    if type(batch) is TensorDict:
        batch._set_str(key, value, validated=True, inplace=False)
    else:
        batch.set(key, value)


# -- torchrl 0.14.1: a process that extends the buffer while this one samples it -----------------
def can_share_writes(replay_buffer: ReplayBuffer) -> bool:
    """Whether another process can extend ``replay_buffer`` through torchrl's shared state.

    A ``ReplayBuffer`` or ``TensorDictReplayBuffer`` (no subclass) over an initialized 1-D CPU
    ``TensorStorage`` with a plain round-robin writer and no transform or prefetch: its rows
    and counters then live in memory both processes map.
    """
    from torchrl.data import RoundRobinWriter, TensorDictReplayBuffer, TensorStorage
    from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

    rb = replay_buffer
    if type(rb) not in (ReplayBuffer, TensorDictReplayBuffer) or not rb.initialized:
        return False
    storage = rb.storage
    content = storage_content(storage)
    leaves = content.values(True, True) if isinstance(content, TensorDictBase) else [content]
    return (
        isinstance(storage, TensorStorage)
        and storage.initialized
        and all(isinstance(leaf, torch.Tensor) for leaf in leaves)  # no strings: not shareable
        and storage.ndim == 1
        and torch.device(storage.device) == torch.device("cpu")
        and type(rb.writer) in (RoundRobinWriter, TensorDictRoundRobinWriter)
        and (rb.transform is None or len(rb.transform) == 0)
        and not rb._prefetch
        and getattr(storage, "_compilable", False) is False
    )


def writer_view(replay_buffer: ReplayBuffer, lock: Any) -> ReplayBuffer:
    """A buffer on ``replay_buffer``'s storage and writer, for a process that only extends it.

    Its sampler is uniform (a ``PrioritizedSampler`` stays with the buffer that samples). Both
    take ``lock`` around every write and sample, and the rows move to shared memory now so a
    forked process writes into the same pages.
    """
    from torchrl.data import RandomSampler

    content = storage_content(replay_buffer.storage)
    if isinstance(content, TensorDictBase) and not content.is_memmap():
        content.share_memory_()
        content.unlock_()  # share_memory_ locks it; restores of this buffer write new keys
    view = ReplayBuffer(
        storage=replay_buffer.storage, writer=replay_buffer.writer, sampler=RandomSampler()
    )
    for rb in (replay_buffer, view):
        rb.share()
        rb._write_lock = lock
    return view


def stop_sharing_writes(
    replay_buffer: ReplayBuffer, view: ReplayBuffer, *, shared: bool = False
) -> None:
    """Undo :func:`writer_view`: the buffer alone again, ``shared`` as it was before."""
    replay_buffer.share(shared)
    with contextlib.suppress(ValueError):
        replay_buffer.storage._attached_entities.remove(view)


@contextlib.contextmanager
def only_view_attached(replay_buffer: ReplayBuffer, view: ReplayBuffer) -> Iterator[None]:
    """While a writer process starts, its copy of the storage notifies only ``view``: carrying ``replay_buffer`` would pickle its sampler (spawn) or update a priority tree nobody reads (fork)."""
    attached = replay_buffer.storage._attached_entities
    kept = list(attached)
    attached[:] = [view]
    try:
        yield
    finally:
        attached[:] = kept


@contextlib.contextmanager
def writes_held(replay_buffer: ReplayBuffer) -> Iterator[None]:
    """Hold off writes and samples as ``rb.sample`` does (its thread lock and write lock, shared with a writer process)."""
    nothing = contextlib.nullcontext()
    with (
        getattr(replay_buffer, "_replay_lock", nothing),
        getattr(replay_buffer, "_write_lock", nothing),
    ):
        yield


# -- tensordict 0.14: the value inside a NonTensorData ------------------------------------------
def non_tensor_value(item: Any) -> Any:
    """The value a ``NonTensorData`` holds, without the tensorclass ``__getattr__`` (~9 us an item in tensordict 0.14.3)."""
    return item._non_tensordict["data"]
