"""Smoke test of benchmarks/time_to_goal.py: the CLI runs and prints its table; the summary parser.

No timing assertions: time to the goal is measured by running the benchmark itself.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "time_to_goal.py"

# What `python train.py fit --config configs/cartpole_dqn.yaml` prints when it stops.
OURS_OUTPUT = """\
step: 100%|██████████| 9800/9800 [00:41<00:00, 238.1it/s, episode_return=482.30]
fit stopped at step 9,800 after 41.2 s: goal reached, episode_return 482.30 >= 475.0
  episode_return 482.3 | frames 39,424 | loss 0.003656
  checkpoint  runs/cartpole_dqn/version_0/checkpoints/last.ckpt
  metrics     runs/cartpole_dqn/version_0/metrics.csv
"""


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("rb_lightning_bench_time_to_goal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_summary_parser_reads_the_goal_line_and_the_headline_metrics(bench):
    summary = bench.parse_summary(OURS_OUTPUT)
    assert summary["step"] == 9800
    assert summary["seconds"] == pytest.approx(41.2)
    assert summary["reached"] is True
    assert summary["episode_return"] == pytest.approx(482.3)
    assert summary["frames"] == 39424

    capped = bench.parse_summary(
        "fit stopped at step 1,200,000 after 1,234.5 s: max_steps=1,200,000 reached\n"
        "  episode_return -1,158.52 | frames 1,201,000\n"
    )
    assert capped["step"] == 1_200_000 and capped["seconds"] == pytest.approx(1234.5)
    assert capped["reached"] is False
    assert capped["episode_return"] == pytest.approx(-1158.52)
    assert capped["frames"] == 1_201_000
    assert bench.parse_summary("Epoch 3: 100%|...| loss=0.1") == {}


def test_metrics_csv_fallback(bench, tmp_path):
    run = tmp_path / "cartpole_dqn" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "episode_return,frames,loss,step\n22.0,1256,,99\n,,0.2,99\n480.5,4096,,199\n"
    )
    assert bench.read_metrics_csv(tmp_path) == {
        "step": 199.0,
        "frames": 4096.0,
        "episode_return": 480.5,
    }
    assert bench.read_metrics_csv(tmp_path / "missing") == {}


def test_cli_runs_the_reference_dqn_and_prints_the_table():
    command = [sys.executable, str(SCRIPT), "--task", "cartpole", "--runs", "reference"]
    command += ["--seeds", "0", "--quick", "--max-steps", "200", "--timeout", "120"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "### cartpole: time to mean return ≥ 475" in out
    assert "| run | seed | reached | return | frames | steps | wall (s) |" in out
    row = next(line for line in out.splitlines() if line.startswith("| reference DQN"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "0" and cells[2] == "no"  # capped far below the goal
    assert cells[4] == "1,200" and cells[5] == "200"  # 1,000 warm-start frames + 1 per step
    assert "| **median**, reference |" in out


def test_reference_agents_refuse_a_thread_count_below_one():
    script = ROOT / "benchmarks" / "reference_agents.py"
    done = subprocess.run(
        # --max-steps 1: were the check gone, the run would end at once, not time out.
        [sys.executable, str(script), "sac", "--threads", "0", "--max-steps", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--threads must be a positive integer, got 0." in done.stderr
    assert "Traceback" not in done.stderr
