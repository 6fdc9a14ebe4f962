"""What runs inside a buffer actor's process: it keeps no semaphore name in ``/dev/shm``.

Under torchrl's *spawn* start method each ``multiprocessing`` ``Value`` or ``Lock`` is a
named POSIX semaphore, removed at a normal exit or by the resource tracker; a Ray actor
gets neither (``ray.kill`` skips finalizers and kills the tracker), so every buffer actor
left five names behind. An actor shares no semaphore, so
:func:`semaphore_names_released` removes the names. It is nested so that Ray sends it by
value (the actor then needs torchrl only).

Examples:
    >>> semaphore_names_released().__qualname__
    'semaphore_names_released.<locals>.release'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["semaphore_names_released"]


def semaphore_names_released() -> Callable[..., int]:
    """A function (sent by value to an actor) that removes its process's semaphore names.

    Called in the actor (``actor.__ray_call__.remote(semaphore_names_released())``, or
    directly in an actor class), it does at once what the process's exit would have
    done for each named semaphore: unlink the name and tell the resource tracker, then
    the semaphore lives on unnamed in this process until it is collected. Semaphores
    made later are unnamed from the start (the process's start method becomes *fork*,
    the only start method under which multiprocessing makes them so; an actor starts
    no process). Returns how many names it removed. Extra arguments (the actor
    instance, from ``__ray_call__``) are ignored.
    """

    def release(*_: Any) -> int:
        import multiprocessing
        from multiprocessing import synchronize, util

        multiprocessing.set_start_method("fork", force=True)
        removed = 0
        registry = util._finalizer_registry  # type: ignore[attr-defined]
        for finalizer in list(registry.values()):
            # SemLock registers Finalize(lock, SemLock._cleanup, (name,)) for a named one.
            cleanup = synchronize.SemLock._cleanup  # type: ignore[attr-defined]
            if getattr(finalizer, "_callback", None) is cleanup:
                finalizer()  # sem_unlink(name), and the tracker forgets it
                removed += 1
        return removed

    return release
