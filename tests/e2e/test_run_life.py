"""The main job's whole life through ``train.py``: fit, Ctrl-C, resume, kill -9, resume, finish.

Each step is a fresh ``python train.py ...`` process, as a user types it; what
is checked is what the user reads (exit code, summary) and what the run left on
disk (checkpoints, metrics.csv, curves.png).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("gymnasium")

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT_EVERY = 100


def _config(tmp_path: Path) -> Path:
    """configs/cartpole_dqn.yaml, checkpointing every 100 steps and never stopping by itself."""
    config = yaml.safe_load((REPO / "configs" / "cartpole_dqn.yaml").read_text())
    trainer = config["trainer"]
    trainer["max_steps"] = 1_000_000  # the test stops it
    trainer["enable_progress_bar"] = False
    trainer["enable_model_summary"] = False
    trainer["logger"]["init_args"]["save_dir"] = str(tmp_path / "runs")
    for callback in trainer["callbacks"]:
        args = callback.setdefault("init_args", {})
        if callback["class_path"].endswith("FinalLastCheckpoint"):
            args["every_n_train_steps"] = CHECKPOINT_EVERY
        if callback["class_path"].endswith("OnlineCollector"):
            args.update(init_random_frames=256, num_envs=4)
    trainer["callbacks"] = [
        c for c in trainer["callbacks"] if not c["class_path"].endswith("StopAtGoal")
    ]
    path = tmp_path / "cartpole_dqn.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _train(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    # faulthandler: a run that hangs is killed with SIGABRT and leaves every thread's stack.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
    }
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        # A job started in the background by a non-interactive shell inherits SIGINT
        # ignored, and Python then installs no Ctrl-C handler: give the run the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_exit(process: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # faulthandler writes the stacks to the log
        process.wait(timeout=30)
        raise AssertionError(
            f"no exit {timeout}s after Ctrl-C:\n{log.read_text()[-6000:]}"
        ) from None


def _read_checkpoint(path: Path) -> dict | None:
    try:  # Lightning may be writing it right now
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception:
        return None


def _wait_for_step(process: subprocess.Popen, path: Path, step: int, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before the test stopped it"
        checkpoint = _read_checkpoint(path) if path.is_file() else None
        if checkpoint is not None and checkpoint["global_step"] >= step:
            return checkpoint
        time.sleep(0.5)
    process.kill()
    raise AssertionError(f"no checkpoint of step >= {step} in {timeout}s")


def _state(checkpoint: dict) -> dict:
    collector = checkpoint["callbacks"]["OnlineCollector"]
    return {
        "step": checkpoint["global_step"],
        "frames": collector["frames"],
        "episodes": collector["episodes"],
        "returns": collector["recent_returns"],
        # Items written so far: the config's buffer holds 1,000, so its length stops growing.
        "buffer_writes": checkpoint["ReplayBufferDataModule"]["buffer"]["write_count"],
    }


def _logged(metrics_csv: Path, name: str) -> dict[int, float]:
    with metrics_csv.open() as file:
        return {int(r["step"]): float(r[name]) for r in csv.DictReader(file) if r.get(name)}


@pytest.mark.slow
def test_interrupt_kill_and_resume_continue_the_run(tmp_path):
    config = _config(tmp_path)
    run = tmp_path / "runs" / "cartpole_dqn" / "version_0"
    last = run / "checkpoints" / "last.ckpt"

    # 1. fit, then Ctrl-C once a checkpoint of step >= 200 exists.
    first = _train(["fit", "--config", str(config)], tmp_path, tmp_path / "1.log")
    _wait_for_step(first, last, 2 * CHECKPOINT_EVERY)
    first.send_signal(signal.SIGINT)
    _wait_for_exit(first, tmp_path / "1.log")
    out = (tmp_path / "1.log").read_text()
    assert "Traceback" not in out
    assert "interrupted (Ctrl-C)" in out
    assert "--ckpt_path last" in out  # how to resume
    assert (run / "curves.png").is_file()
    a = _state(_read_checkpoint(last))
    assert a["step"] >= 2 * CHECKPOINT_EVERY and a["frames"] >= 256 and a["episodes"] > 0

    # 2. resume with --ckpt_path last, then kill -9 (no chance to clean up).
    second = _train(
        ["fit", "--config", str(config), "--ckpt_path", "last"], tmp_path, tmp_path / "2.log"
    )
    b = _state(_wait_for_step(second, last, a["step"] + 2 * CHECKPOINT_EVERY))
    second.kill()
    second.wait(timeout=60)
    # The run continued: nothing restarted from zero.
    assert b["step"] >= a["step"] + 2 * CHECKPOINT_EVERY
    assert b["frames"] > a["frames"]
    assert b["episodes"] > a["episodes"]
    assert b["buffer_writes"] > a["buffer_writes"]
    assert not (tmp_path / "runs" / "cartpole_dqn" / "version_1").exists()  # same run dir

    # 3. resume again and run 100 more steps to the end.
    final_step = b["step"] + CHECKPOINT_EVERY
    third = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "fit",
            "--config",
            str(config),
            "--ckpt_path",
            "last",
            f"--trainer.max_steps={final_step}",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = third.stdout + third.stderr
    assert third.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert "last_cursor is None" not in out  # torchrl's false alarm on resume is silenced
    assert "weights_only" not in out  # the last checkpoint's kind is said, not defaulted
    assert f"fit stopped at step {final_step:,}" in out
    assert f"max_steps={final_step:,} reached" in out
    c = _state(_read_checkpoint(last))
    assert c["step"] == final_step
    assert c["frames"] >= b["frames"] and c["buffer_writes"] >= b["buffer_writes"]

    # Epsilon follows the schedule of the whole run, not a restarted one.
    epsilon = _logged(run / "metrics.csv", "epsilon")
    model = yaml.safe_load(config.read_text())["model"]["init_args"]
    for step, value in epsilon.items():
        progress = min(step / model["eps_decay_steps"], 1.0)
        expected = model["eps_start"] + progress * (model["eps_end"] - model["eps_start"])
        assert value == pytest.approx(expected, abs=1e-3), step  # +-4 steps
    assert max(epsilon) > b["step"] and min(epsilon) < a["step"]  # rows of all three processes
