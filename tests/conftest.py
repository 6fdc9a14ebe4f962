"""Shared fixtures: small real replay buffers built in the test itself."""

from __future__ import annotations

import os

import pytest
import torch
from rb_testdata import make_transitions
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer

# Two cores: keep torch from oversubscribing them while tests run side by side.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


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
