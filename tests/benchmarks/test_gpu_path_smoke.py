"""Smoke test of benchmarks/gpu_path.py: every path runs on the CPU and the table prints.

No timing assertions: the GPU numbers come from running the script on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_path.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("rb_lightning_bench_gpu_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cpu_smoke_mode_runs_every_path_and_prints_the_table(bench, capsys):
    argv = ["--device", "cpu", "--steps", "3", "--warmup", "1", "--capacity", "256"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| rl_mlp") or line.startswith("| transformer")
    ]
    assert len(rows) == len(bench.STEPS) * len(bench.PATHS)
    assert all(row.endswith("| n/a |") for row in rows)  # no GPU: no busy fraction
    assert "| 1.00 |" in out  # (d) against itself


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(bench, capsys):
    assert bench.main([]) == bench.NO_CUDA_EXIT == 2
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and "no CUDA device" in out
