"""The random stream a collector explores with: a function of (seed, rank), apart from training's.

Examples:
    >>> import torch
    >>> stream = CollectionRandomness(rank_seed(7, rank=1))
    >>> with stream.active():
    ...     drawn = torch.rand(2)
    >>> with CollectionRandomness(rank_seed(7, rank=1)).active():
    ...     torch.equal(drawn, torch.rand(2))  # the same (seed, rank): the same draws
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rb_lightning.stream.sharding import Shard, draw_base_seed

__all__ = ["CollectionRandomness", "rank_seed"]


def rank_seed(seed: int | None, rank: int) -> int:
    """The seed of rank ``rank``'s environment and exploration (rank 0: ``seed`` itself).

    ``seed=None`` draws the base from torch's global generator, which ``seed_everything``
    makes the same on every rank: the rank then makes the streams differ.
    """
    base = seed if seed is not None else draw_base_seed()
    return Shard(rank=rank).seed(base) % (2**31 - 1)


class CollectionRandomness:
    """torch's global random stream while collecting, swapped for one of its own, so ranks explore differently and training's draws do not depend on how much was collected."""

    def __init__(self, seed: int) -> None:
        self.state = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Draw from this stream inside the block."""
        training = torch.random.get_rng_state()
        torch.random.set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = torch.random.get_rng_state()
            torch.random.set_rng_state(training)
