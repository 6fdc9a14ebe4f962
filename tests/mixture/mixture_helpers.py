"""Small real mixtures for tests/mixture: an "offline" uniform member and a prioritized "online" one."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer, TensorDictReplayBuffer

from rb_lightning import BufferMixture

OFFLINE_ID0 = 0
ONLINE_ID0 = 100_000


def items(n: int, start: int) -> TensorDict:
    """``n`` items with ids ``start...``; content is a function of the id (no RNG)."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"id": ids, "obs": (ids.float() / 1000).unsqueeze(-1).expand(n, 4).clone()},
        batch_size=[n],
    )


def member(prioritized: bool, capacity: int = 200) -> ReplayBuffer:
    sampler = PrioritizedSampler(capacity, alpha=0.8, beta=0.5) if prioritized else None
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)


def make_mixture(
    *, offline: int = 60, online: int = 40, seed: int = 0, **composition: dict[str, float]
) -> BufferMixture:
    """offline (uniform) + online (prioritized), filled with ``offline`` / ``online`` items."""
    off, on = member(False), member(True)
    if offline:
        off.extend(items(offline, OFFLINE_ID0))
    if online:
        on.extend(items(online, ONLINE_ID0))
    if not composition:
        composition = {"fractions": {"offline": 0.5, "online": 0.5}}
    mix = BufferMixture({"offline": off, "online": on}, **composition)
    mix.set_rng(torch.Generator().manual_seed(seed))
    return mix
