"""Test data shared by the root test modules (a uniquely named module: conftest.py files
in subfolders would shadow a plain ``from conftest import ...``)."""

from __future__ import annotations

import torch
from tensordict import NonTensorStack, TensorDict


def make_transitions(n: int, start: int = 0) -> TensorDict:
    """RL-like items with an id, a nested key and a string per item."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "id": ids,
            "obs": torch.randn(n, 4),
            "action": torch.randint(0, 2, (n,)),
            "next": {
                "reward": ids.float().unsqueeze(-1),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
            "prompt": NonTensorStack(*[f"item {i}" for i in ids.tolist()]),
        },
        batch_size=[n],
    )


def id_items(ids: torch.Tensor) -> TensorDict:
    """Items that carry their id and an ``obs`` made from it (``float(id)``, one column)."""
    return TensorDict({"id": ids, "obs": ids.float().unsqueeze(-1)}, batch_size=ids.shape)
