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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Which tests pytest-xdist runs in the same test process (``--dist loadgroup``).

    A file's tests stay together: module-scoped fixtures (a DDP run shared by a file's
    tests) then run once. Every Ray test runs in one process, one after another:
    ``ray.init()`` joins a cluster another test started with ``ray start`` on this
    machine instead of starting its own.
    """
    for item in items:
        group = "ray" if item.get_closest_marker("ray") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
