"""Every line a user reads in ``fit``, ``fit --ckpt_path last``, ``validate`` and ``test`` is one they need.

Each command runs through ``train.py`` as a user types it, with its progress bar;
a line that matches nothing in the allow-list (``tests/run_output.py``: not a
library's INFO line, a deprecation warning, an advertisement, a stale bar) fails.
``tests/e2e/test_shipped_configs.py`` holds every shipped config's ``fit``,
``validate`` and ``test`` and the helper scripts to the same list.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_output import unexpected_lines

REPO = Path(__file__).resolve().parents[2]


def _train(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "short", "longer", "extra"),
    [
        ("cartpole_dqn", 200, 300, "gymnasium"),
        ("llm_sft", 20, 30, "transformers"),
    ],
)
def test_every_line_of_a_runs_life_is_on_the_allow_list(tmp_path, config, short, longer, extra):
    pytest.importorskip(extra)
    path = str(REPO / "configs" / f"{config}.yaml")
    commands = [
        ["fit", "--config", path, f"--trainer.max_steps={short}"],
        ["fit", "--config", path, f"--trainer.max_steps={longer}", "--ckpt_path", "last"],
        ["validate", "--config", path, "--ckpt_path", "last"],
        ["test", "--config", path, "--ckpt_path", "last"],
    ]
    for command in commands:
        out = _train(command, tmp_path)
        assert unexpected_lines(out) == [], f"{' '.join(command[:1] + command[3:])}:\n{out[-3000:]}"
    assert "Traceback" not in out
