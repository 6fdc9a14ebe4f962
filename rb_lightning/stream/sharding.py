"""Where this iterator runs: DataLoader worker and distributed rank.

Every copy of a buffer-backed dataset (one per DataLoader worker, one per DDP
rank) must draw a different random stream and its own share of an epoch. This
module answers "who am I" and derives seeds and shares from that.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

# Large odd constants keep (seed, rank, worker) combinations far apart.
_RANK_STRIDE = 1_000_003
_WORKER_STRIDE = 7_919
_EPOCH_STRIDE = 104_729


@dataclass(frozen=True)
class Shard:
    """Position of the running iterator among all workers of all ranks."""

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1
    worker_seed: int | None = None

    @property
    def is_replica(self) -> bool:
        """True when other copies of this dataset sample concurrently."""
        return self.world_size > 1 or self.num_workers > 1

    def share(self, total: int) -> int:
        """This worker's share of ``total`` items; the shares add up to ``total``."""
        base, extra = divmod(total, self.num_workers)
        return base + (1 if self.worker_id < extra else 0)

    def seed(self, base_seed: int) -> int:
        """A seed unique to (base_seed, rank, worker)."""
        # In a worker, base_seed is drawn from the worker's own RNG, which advances every
        # epoch: persistent workers must not replay the previous epoch's stream.
        seed = base_seed if self.worker_seed is None else self.worker_seed ^ base_seed
        return (seed + _RANK_STRIDE * self.rank + _WORKER_STRIDE * self.worker_id) % (2**63 - 1)

    def epoch_seed(self, stream_seed: int, epoch: int, worker_id: int | None = None) -> int:
        """A seed unique to (stream_seed, epoch, rank, worker) that depends on no RNG state, so a checkpoint reproduces it (``worker_id``: a resumed epoch's shifted role)."""
        worker = self.worker_id if worker_id is None else worker_id
        mixed = (
            stream_seed
            + _EPOCH_STRIDE * (epoch + 1)
            + _RANK_STRIDE * self.rank
            + _WORKER_STRIDE * (worker + 1)
        )
        return mixed % (2**63 - 1)


def one_order_draws(
    shard: Shard, position: int, num_batches: int | None, *, restored: bool
) -> Iterator[int]:
    """For each batch this copy takes of one shared order: the draws to skip before it.

    Every copy of a stream without replacement follows the order one process would draw
    and takes its own batches of it: rank ``r`` of ``R`` the batches ``j * R + r``, and of
    those, worker ``w`` of ``W`` the ``j`` that torch deals it (round-robin, from
    ``position``, the batches of the epoch already taken). ``restored``: the copy's sampler
    continues a checkpoint taken after batch ``position - 1``, not the epoch's start.

    Examples:
        >>> list(one_order_draws(Shard(rank=1, world_size=2), 0, 3, restored=False))
        [1, 1, 1]
    """
    in_worker = shard.worker_seed is not None
    first = position + (shard.worker_id if in_worker else 0)
    step = shard.num_workers if in_worker else 1
    own = itertools.count(first, step) if num_batches is None else range(first, num_batches, step)
    world, rank = shard.world_size, shard.rank
    drawn = (position - 1) * world + rank + 1 if restored else 0
    for j in own:
        yield j * world + rank - drawn
        drawn = j * world + rank + 1


def current_shard() -> Shard:
    """Describe the calling process: DataLoader worker (if any) and rank (if distributed)."""
    rank, world_size = 0, 1
    if dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    info = get_worker_info()
    if info is None:
        return Shard(rank=rank, world_size=world_size)
    return Shard(
        rank=rank,
        world_size=world_size,
        worker_id=info.id,
        num_workers=info.num_workers,
        worker_seed=info.seed,
    )


def draw_base_seed() -> int:
    """A seed drawn from torch's global RNG, as ``DataLoader`` does for its workers."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


__all__ = ["Shard", "current_shard", "draw_base_seed", "one_order_draws"]
