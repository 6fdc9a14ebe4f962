"""A source for a :class:`~rb_lightning.BufferMixture`: each member filled from its own source."""

from __future__ import annotations

from collections.abc import Mapping

from torchrl.data import ReplayBuffer

from rb_lightning.buffers.mixture import BufferMixture
from rb_lightning.errors import ArgumentTypeError, SourceError
from rb_lightning.sources.buffer_sources import BufferSource

__all__ = ["FillMembers"]


class FillMembers(BufferSource):
    """A source that fills members of a :class:`BufferMixture`, each from its own source.

    ``ReplayBufferDataModule(mixture, source=FillMembers({"offline": LoadDirectory(dir)}))``
    loads the offline member before fit and leaves the others (e.g. the one a
    collector fills) as they are.

    Args:
        sources: Member name -> :class:`~rb_lightning.sources.BufferSource`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from rb_lightning.buffers.mixture import BufferMixture
        >>> a = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
        >>> b = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
        >>> mix = BufferMixture({"a": a, "b": b})
        >>> FillMembers({}).fill(mix)  # nothing to fill
        >>> len(mix)
        0
    """

    def __init__(self, sources: Mapping[str, BufferSource]) -> None:
        for name, source in sources.items():
            if not isinstance(source, BufferSource):
                raise ArgumentTypeError(
                    "sources",
                    f"FillMembers(sources={{{name!r}: ...}}) must be a BufferSource "
                    f"(LoadDirectory, CallSource), got {type(source).__name__}.",
                )
        self.sources = dict(sources)

    def fill(self, replay_buffer: ReplayBuffer) -> None:
        """Fill each named member of ``replay_buffer`` (a :class:`BufferMixture`)."""
        if not isinstance(replay_buffer, BufferMixture):
            raise SourceError(
                "FillMembers fills members of a BufferMixture, but the DataModule's "
                f"replay_buffer is a {type(replay_buffer).__name__}. Use a plain source "
                "(LoadDirectory) for a single buffer."
            )
        for name, source in self.sources.items():
            if name not in replay_buffer.names:
                raise SourceError(
                    f"FillMembers(sources=...) names the member {name!r}; the mixture's members "
                    f"are {replay_buffer.names}."
                )
            source.fill(replay_buffer.member(name))

    def __repr__(self) -> str:
        return f"FillMembers({self.sources!r})"
