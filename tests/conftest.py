"""Shared fixtures: small real replay buffers built in the test itself."""

from __future__ import annotations

import os

import pytest
import torch
from tensordict import NonTensorStack, TensorDict
from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer

# Two cores: keep torch from oversubscribing them while tests run side by side.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


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


@pytest.fixture
def tensor_rb() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
    rb.extend(make_transitions(200))
    return rb


@pytest.fixture
def list_rb() -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(100))
    for i in range(20):
        rb.add(
            TensorDict(
                {
                    "input_ids": torch.full((8,), i),
                    "attention_mask": torch.ones(8, dtype=torch.long),
                },
                batch_size=[],
            )
        )
    return rb
