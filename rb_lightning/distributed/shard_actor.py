"""The class each Ray actor of a ``ShardedRayReplayBuffer`` runs: one torchrl ``ReplayBuffer``.

Ray sends the class by value to every shard's process, which then needs torchrl only; the
readers of a ``PrioritizedSampler``'s trees it uses come from
:func:`rb_lightning.torchrl_compat.priority_tree_readers`, sent by value too.

Examples:
    >>> cls = shard_actor_class()
    >>> shard = cls(capacity=8, prioritized=False, alpha=0.6, beta=0.4, eps=1e-8, seed=0)
    >>> shard.mass()
    (0, 0.0, 1.0)
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torchrl.data import ReplayBuffer

from rb_lightning.torchrl_compat import priority_tree_readers

__all__ = ["shard_actor_class"]


def shard_actor_class() -> Any:
    """The class each Ray actor of a ``ShardedRayReplayBuffer`` runs: one torchrl ``ReplayBuffer``.

    Defined inside this function so Ray sends it by value (a shard needs torchrl only); each
    method is one actor call, atomic with respect to the shard's writes.
    """
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler, RoundRobinWriter

    tree_mass, stored_values = priority_tree_readers()

    class BufferShard:
        def __init__(
            self, capacity: int, prioritized: bool, alpha: float, beta: float, eps: float, seed: int
        ) -> None:
            sampler: Any = RandomSampler()
            if prioritized:
                sampler = PrioritizedSampler(capacity, alpha, beta, eps=eps)
            self.rb = ReplayBuffer(
                storage=LazyTensorStorage(capacity),
                sampler=sampler,
                writer=RoundRobinWriter(track_generations=True),
            )
            self.rb.set_rng(torch.Generator().manual_seed(seed))

        def mass(self) -> tuple[int, float, float]:
            # (items, sampling mass, smallest stored p**alpha); uniform: mass == items.
            n = len(self.rb)
            trees = tree_mass(self.rb.sampler, n) if n else None
            return (n, float(n), 1.0) if trees is None else (n, *trees)

        def extend(self, data: Any) -> tuple[Any, tuple[int, float, float]]:
            return self.rb.extend(data), self.mass()

        def draw(self, n: int) -> tuple[Any, Any, Any, Any, tuple[int, float, float]]:
            # (items, local index, generation, p**alpha of each or None, mass after)
            batch, info = self.rb.sample(n, return_info=True)
            index = torch.as_tensor(info["index"])
            stored = stored_values(self.rb.sampler, index)
            return batch, index, info.get("index_generation"), stored, self.mass()

        def update(self, index: Any, generation: Any, priority: Any) -> tuple[int, Any]:
            # Only slots still holding the sampled item: a slot written again since the
            # sample (another generation) keeps its new item's priority, as
            # ReplayBuffer.update_if_present skips such slots.
            dropped = 0
            if generation is not None:
                live = self.rb.writer.generations_of(index) == generation
                index, priority = index[live], priority[live]
                dropped = int((~live).sum())
            if index.numel():
                self.rb.update_priority(index, priority)
            return dropped, self.mass()

        def read(self, alpha: float | None, eps: float) -> tuple[Any, Any]:
            # Every item in storage order and its priority (None: uniform sampler).
            n = len(self.rb)
            if n == 0:
                return None, None
            items = self.rb[:n]
            stored = stored_values(self.rb.sampler, torch.arange(n))
            if stored is None or alpha is None:
                return items, None
            return items, (stored ** (1.0 / alpha) - eps).clamp_min(0.0)

        def dump(self, target: str) -> int:
            if len(self.rb) == 0:
                os.makedirs(target, exist_ok=True)
            else:
                self.rb.dumps(target)
            return len(self.rb)

        def load(self, source: str) -> int:
            if not os.listdir(source):
                self.rb.empty()
            else:
                self.rb.loads(source)
            return len(self.rb)

        def clear(self) -> int:
            self.rb.empty()
            return 0

        def write_count(self) -> int:
            return int(self.rb.write_count)

        def pid(self) -> int:
            return os.getpid()

    return BufferShard
