"""Run a script of ``tests/scale/scripts/`` or ``train.py`` in a subprocess, as a user would.

Lightning's DDP launcher re-runs the launching script for every other rank, so multi-process
runs live in scripts; each rank writes ``rank<r>.json`` into the run's folder. The scripts
import this folder's modules (``from trainers import quiet_trainer``): ``tests/`` is put on
their ``PYTHONPATH``.

``rank_results(run_script("ddp_resume.py", out_dir, 8), out_dir)`` in a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "scale" / "scripts"
TIMEOUT_S = 300


def script_env() -> dict[str, str]:
    """The environment of a DDP script: loopback rendezvous on a free port, ``tests/`` importable."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    env.pop("MASTER_PORT", None)  # Lightning picks a free one
    return env


def start_script(script: str, *args: object) -> subprocess.Popen:
    """``python scripts/<script> ARGS...`` started in the background (runs overlap start-up)."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *map(str, args)],
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish_script(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> str:
    """Wait for a started script; fail the test (with its output's tail) on a hang or an error."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"{proc.args[1]} did not finish in {timeout}s (hang?):\n{output[-3000:]}")
    assert proc.returncode == 0, f"{proc.args[1]} failed:\n{output[-4000:]}"
    return output


def run_script(script: str, *args: object, timeout: float = TIMEOUT_S) -> str:
    """Run a script to its end; its output."""
    return finish_script(start_script(script, *args), timeout)


def rank_results(out_dir: Path, world_size: int = 2) -> list[dict]:
    """What each rank of a run wrote to ``out_dir/rank<r>.json``, by rank."""
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


def run_train_py(
    args: list[str], cwd: Path, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` in ``cwd`` (its DDP ranks on this machine, a free port).

    ``env`` (default: this process's) gets the checkout and the CLI tests' toy models
    (``tests/cli``, e.g. ``cli_toy.Regressor``) on ``PYTHONPATH``.
    """
    env = {
        **(os.environ if env is None else env),
        "PYTHONPATH": f"{TESTS / 'cli'}{os.pathsep}{REPO}",
        "MASTER_ADDR": "127.0.0.1",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("MASTER_PORT", None)
    env.pop("RB_LIGHTNING_DEBUG", None)
    command = [sys.executable, str(REPO / "train.py"), *args]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
