"""Plugins register themselves: a lower layer finds what they add without importing them.

Each check runs in a fresh interpreter that imports only the lower layer's module, so
nothing a test imported earlier stands in for the registration ``import rb_lightning`` does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]  # torchrl may log a line before


def test_a_ray_served_buffer_gets_the_plugins_handle_from_the_buffers_layer():
    out = _run(
        """
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from rb_lightning.buffers.handles import resolve_buffer

        class Served(ReplayBuffer):  # what torchrl's RayReplayBuffer says of itself
            service_backend = "ray"

        print(type(resolve_buffer(Served(storage=LazyTensorStorage(4)))).__name__)
        """
    )
    assert out == "RemoteBuffer"


def test_a_datasets_as_hf_dataset_reaches_the_hf_plugin_from_the_stream_layer():
    out = _run(
        """
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from rb_lightning.stream.datasets import ReplayBufferPassDataset

        rb = ReplayBuffer(storage=LazyTensorStorage(4))
        rb.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
        print(type(ReplayBufferPassDataset(rb, batch_size=2).as_hf_dataset()).__name__)
        """
    )
    assert out == "Dataset"
