"""Every line a user reads in ``fit``, ``fit --ckpt_path last``, ``validate`` and ``test`` is one they need.

Each command runs through ``train.py`` as a user types it, with its progress bar;
a line that matches nothing in the allow-list below (a library's INFO line, a
deprecation warning, an advertisement, a warning about our own settings) fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ALLOWED = [
    r"Seed set to \d+",
    r"GPU available: (True|False).*",
    # fit's start and end
    r"fit: (resuming|extending the finished run) runs/\S+ from step [\d,]+.*",
    r"(validate|test): the model of runs/\S+/last\.ckpt \(step [\d,]+\)",
    r"fit stopped at step [\d,]+ after [\d.]+ s: .*",
    r"  \S.* \| .*|  (episode_return|val_loss|train_loss|loss) \S+",  # headline metrics
    r"  (checkpoint|metrics|curves|resume) +\S.*",
    # Lightning's model summary and its metrics table (validate / test)
    r"[┏┃┡│└].*",
    r"(Trainable|Non-trainable|Total) params: .*",
    r"Total estimated model params size \(MB\): .*",
    r"Modules in (train|eval) mode: \d+",
    r"Total FLOPs: \d+",
    # progress bars (one line per refresh once \r is read as a line break)
    r"(step|Training|Validation|Testing|Sanity Checking)\b.*(it/s|\?it/s|s/it)?.*",
    r"Epoch \d+.*",
]
ALLOWED_LINE = re.compile("|".join(f"(?:{pattern})" for pattern in ALLOWED))


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


def _unexpected(out: str) -> list[str]:
    lines = [line.rstrip() for line in out.replace("\r", "\n").splitlines()]
    return [line for line in lines if line.strip() and not ALLOWED_LINE.fullmatch(line)]


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
        assert _unexpected(out) == [], f"{' '.join(command[:1] + command[3:])}:\n{out[-3000:]}"
    assert "Traceback" not in out
