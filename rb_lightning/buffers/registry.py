"""Kinds of buffer that plugins add: a test on the buffer, and the handle that serves it.

:func:`~rb_lightning.buffers.handles.resolve_buffer` asks here first, so a
plugin adds a kind of buffer without a branch in a lower layer
(:mod:`rb_lightning.distributed` registers torchrl's Ray-served buffers). A
buffer class of one's own can instead define ``buffer_handle()``. Importing
this module imports nothing heavy: a plugin registers when it is imported.

Examples:
    >>> class Tagged:
    ...     tagged = True
    >>> register_buffer_kind(lambda rb: getattr(rb, "tagged", False), lambda rb: "its handle")
    >>> registered_handle(Tagged()), registered_handle(object())
    ('its handle', None)
    >>> unregister_buffer_kind(0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_buffer_kind", "registered_handle", "unregister_buffer_kind"]

#: ``(matches, make_handle)`` pairs, the newest first.
_KINDS: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []


def register_buffer_kind(matches: Callable[[Any], bool], handle: Callable[[Any], Any]) -> None:
    """Serve every buffer for which ``matches(buffer)`` is true through ``handle(buffer)``.

    Args:
        matches: A cheap test on the buffer object (no import of the plugin's
            dependencies: it runs for every buffer).
        handle: Builds the :class:`~rb_lightning.buffers.handles.BufferHandle`
            (it may import the plugin's modules then).
    """
    _KINDS.insert(0, (matches, handle))


def unregister_buffer_kind(position: int) -> None:
    """Remove the kind registered ``position``-th from the newest (``0``: the last one)."""
    del _KINDS[position]


def registered_handle(replay_buffer: Any) -> Any | None:
    """The handle a registered kind gives ``replay_buffer``; ``None`` when none matches."""
    for matches, handle in _KINDS:
        if matches(replay_buffer):
            return handle(replay_buffer)
    return None
