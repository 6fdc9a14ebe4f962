"""TRL's SFTTrainer continues a Lightning run of llm_sft: it starts at the run's loss and goes down.

docs/trl.md's chain, its three commands as the page has them (tests/trl_docs.py): ``python
train.py fit`` with 60 steps of ``configs/llm_sft.yaml`` (where the loss still falls by about
0.01 a step), the export, then ``python -m rb_lightning.llm.trl_from_disk ...`` with
``--trainer sft --max-steps 20`` appended (argparse keeps the last ``--trainer``).

Before the fix, TRL trained the run's weights with a fresh AdamW at the run's full learning
rate (3e-3, no warm-up, batches of 8, TRL's linear decay and gradient clipping): its first
update moved every weight by about the learning rate, and on this machine the loss went
1.40 -> 2.00 at the second step, 1.3956 -> 1.5222 over the 20 (the mean of the first 5 steps
1.69, 1.2 times the run's last train_loss 1.412). With the run's own optimizer state,
schedule and batch size: 1.3572 -> 1.1994, first 5 steps 1.367, last 5 1.249.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
from pathlib import Path

import pytest
from run_output import unexpected_lines
from trl_docs import chain, runnable

pytest.importorskip("trl")
pytest.importorskip("datasets")
pytestmark = pytest.mark.hf

REPO = Path(__file__).resolve().parents[2]
FIT_STEPS = 60
SFT_STEPS = 20
#: How far above the run's last logged train_loss (one batch of 64) the continuation may start.
START_FACTOR = 1.15


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def _last_train_loss(metrics_csv: Path) -> tuple[int, float]:
    with metrics_csv.open() as file:
        rows = [r for r in csv.DictReader(file) if r.get("train_loss")]
    return int(rows[-1]["step"]) + 1, float(rows[-1]["train_loss"])


def test_sft_continues_the_run_from_its_loss_and_lowers_it(tmp_path):
    fit, export, trl = map(runnable, chain())
    steps = [f"--trainer.max_steps={FIT_STEPS}", "--trainer.log_every_n_steps=10"]
    _run([*fit, *steps, "--trainer.enable_progress_bar=false"], tmp_path)
    run = tmp_path / "runs" / "llm_sft" / "version_0"
    step, run_loss = _last_train_loss(run / "metrics.csv")
    assert step == FIT_STEPS

    _run(export, tmp_path)
    result = _run([*trl, "--trainer", "sft", "--max-steps", str(SFT_STEPS)], tmp_path)
    out = result.stdout + result.stderr
    assert unexpected_lines(out) == []
    line = re.search(rf"SFTTrainer: {SFT_STEPS} steps on 4,096 rows of sft_data, .*", out)
    assert line, out
    line_text = line.group(0)
    loss = re.search(r", loss ([\d.]+) -> ([\d.]+)", line_text)
    assert loss, line_text
    first, last = map(float, loss.groups())
    # It starts where the run stopped (its first step is the run's model, unchanged)...
    assert first <= START_FACTOR * run_loss, (line_text, run_loss)
    # ...and goes down, as the run itself still did.
    assert last < first, line_text
    means = re.search(r"mean of the first 5 steps ([\d.]+), of the last 5 ([\d.]+)", line_text)
    assert means, line_text
    first_mean, last_mean = map(float, means.groups())
    # The steps after the first stay there too (a fresh optimizer's first update threw the
    # loss up by 40%), and the trend is down.
    assert first_mean <= START_FACTOR * run_loss, (line_text, run_loss)
    assert last_mean < first_mean, line_text
    assert line_text.endswith(
        f"; continued runs/llm_sft/version_0 from step {FIT_STEPS} with its optimizer, "
        "learning rate and batch size (64)"
    ), line_text
