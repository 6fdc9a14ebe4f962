"""Spawned DDP ranks (``strategy="ddp_spawn"``) each get a copy of a prioritized sampler.

torchrl's ``PrioritizedSampler`` refuses to be pickled into a new process, but a spawned
rank should get what a ``ddp`` rank builds: its own copy. :func:`copy_into_spawned_processes`
marks the samplers a ``ReplayBufferDataModule`` serves; only those are pickled by value.

Examples:
    >>> from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=PrioritizedSampler(8, 0.6, 0.4))
    >>> copy_into_spawned_processes([rb])  # a spawned process now gets a copy of rb's sampler
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from multiprocessing import context
from multiprocessing.reduction import ForkingPickler
from typing import Any

from torchrl.data import PrioritizedSampler, ReplayBuffer

__all__ = ["copy_into_spawned_processes"]

# Samplers a DataModule serves; weak, so a dropped buffer is not kept alive.
_copied: weakref.WeakSet[PrioritizedSampler] = weakref.WeakSet()


def copy_into_spawned_processes(replay_buffers: Iterable[ReplayBuffer]) -> None:
    """Let the prioritized samplers of ``replay_buffers`` be copied into spawned processes."""
    for replay_buffer in replay_buffers:
        sampler = getattr(replay_buffer, "sampler", None)
        if not isinstance(sampler, PrioritizedSampler):
            continue
        _copied.add(sampler)
        # Reducers are looked up by exact type; registering one again replaces it with itself.
        ForkingPickler.register(type(sampler), _reduce_sampler)


def _reduce_sampler(sampler: PrioritizedSampler) -> Any:
    if sampler not in _copied:
        return sampler.__reduce_ex__(2)  # torchrl's own pickling, refusal included
    # torchrl refuses while a process is being spawned (a thread-local of multiprocessing);
    # its state is read as an ordinary pickle would read it.
    spawning = context.get_spawning_popen()
    context.set_spawning_popen(None)
    try:
        state = sampler.__getstate__()
    finally:
        context.set_spawning_popen(spawning)
    return _rebuild, (type(sampler), state)


def _rebuild(cls: Any, state: dict[str, Any]) -> Any:
    """The sampler in a spawned process, restored as an ordinary unpickling would."""
    sampler = cls.__new__(cls)
    if hasattr(sampler, "__setstate__"):
        sampler.__setstate__(state)
    else:
        vars(sampler).update(state)
    return sampler
