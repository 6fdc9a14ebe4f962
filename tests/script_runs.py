"""Run a script of ``tests/scale/scripts/`` in a subprocess and read what each rank wrote.

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
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
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
