"""The main job with a samples-per-insert rate limiter, as a user runs it: train.py in a subprocess.

The synchronous collector collects when the limiter says the trainer needs
frames, so the replay ratio is the one asked for; the limiter's counters are in
the checkpoint, so a resumed run continues the ratio where it was.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
MAIN_JOB = str(REPO / "configs" / "cartpole_dqn.yaml")
BATCH = 16  # configs/cartpole_dqn.yaml
LIMITER = [
    "--data.rate_limiter.samples_per_insert=4",
    "--data.rate_limiter.min_size=1000",  # the collector's warm-up: nothing owed before it
    "--trainer.log_every_n_steps=50",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _limiter_state(run: Path) -> dict[str, int]:
    checkpoint = torch.load(
        run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True, mmap=True
    )
    return checkpoint["ReplayBufferDataModule"]["rate_limiter"]


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as file:
        return [row for row in csv.DictReader(file) if row.get("replay/samples_per_insert")]


def test_the_ratio_is_the_one_asked_for_and_is_logged(tmp_path):
    done = _train(["fit", "--config", MAIN_JOB, "--trainer.max_steps=200", *LIMITER], tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = tmp_path / "runs" / "cartpole_dqn" / "version_0"
    state = _limiter_state(run)
    # 200 batches, and the one Lightning may have drawn ahead of the last step.
    assert 200 * BATCH <= state["sampled"] <= 201 * BATCH
    owed = (state["inserted"] - 1000) * 4
    # Frames come in whole steps of the config's 16 environments: 16 frames, 64 samples.
    assert abs(state["sampled"] - owed) <= 16 * 4
    rows = _rows(run)
    assert [row["step"] for row in rows] == ["49", "99", "149", "199"]
    assert all(3.5 <= float(row["replay/samples_per_insert"]) <= 4.5 for row in rows)


def test_a_resumed_run_continues_the_ratio_exactly(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    done = _train(["fit", "--config", MAIN_JOB, "--trainer.max_steps=200", *LIMITER], straight)
    assert done.returncode == 0, done.stderr[-2000:]
    first = _train(["fit", "--config", MAIN_JOB, "--trainer.max_steps=100", *LIMITER], resumed)
    assert first.returncode == 0, first.stderr[-2000:]
    args = ["fit", "--config", MAIN_JOB, "--ckpt_path", "last", "--trainer.max_steps=200"]
    second = _train([*args, *LIMITER], resumed)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "runs/cartpole_dqn/version_0 from step 100" in second.stdout
    run = Path("runs") / "cartpole_dqn" / "version_0"
    assert _limiter_state(resumed / run) == _limiter_state(straight / run)
    keys = ("step", "replay/inserted", "replay/sampled", "train_loss")
    assert [{k: row.get(k) for k in keys} for row in _rows(resumed / run)] == [
        {k: row.get(k) for k in keys} for row in _rows(straight / run)
    ]
