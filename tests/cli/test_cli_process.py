"""What the CLI sets up for the process it runs in."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch
from cli_helpers import run_cli, tensor_dict_buffer, toy_config, write_config

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def _nvml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_without_nvml_a_run_stops_torch_probing_for_it_and_answers_the_same(tmp_path, monkeypatch):
    if _nvml_loads():
        pytest.skip("NVML loads here: torch's NVML-based check works and is kept")
    monkeypatch.setenv(NVML_CHECK, "1")  # what importing Lightning sets
    available = torch.cuda.is_available()
    buffer = tensor_dict_buffer(max_size=50)
    config = write_config(toy_config(buffer), tmp_path)
    run_cli(["fit", "--config", str(config), "--trainer.max_steps=2"], tmp_path)
    # Torch's Adam asks torch.cuda.is_available() on every step; without NVML each ask
    # tried to load the library first. The answer is the CUDA runtime's either way.
    assert os.environ[NVML_CHECK] == "0"
    assert torch.cuda.is_available() == available
