"""From a Lightning run to TRL, typed as docs/trl.md says, and the docs' numbers for that run.

``python train.py fit`` of a shipped config, then ``rb-lightning-export-hf`` on its run
directory (the console script as pyproject.toml installs it), then TRL trainers on
``datasets.load_from_disk`` of the export (``python -m rb_lightning.llm.trl_from_disk``);
the main job's numeric columns come back into a replay buffer with ``from_hf_dataset``.
The ``llm_sft`` chain is the page's three commands as written (tests/trl_docs.py), typed
after an earlier run, so the ones after ``fit`` must find the run it wrote, not that one.

The ``llm_sft`` run is 300 steps: its validation losses must show what docs/cli.md says holds
on every CPU (the values themselves differ between CPUs).
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from console_scripts import command
from run_output import unexpected_lines
from trl_docs import chain, runnable

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.hf

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
SFT_STEPS = 300


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "Traceback" not in result.stderr
    return result


def _fit(config: str, cwd: Path, max_steps: int) -> Path:
    _run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "fit",
            "--config",
            str(REPO / "configs" / f"{config}.yaml"),
            f"--trainer.max_steps={max_steps}",
            "--trainer.enable_progress_bar=false",
        ],
        cwd,
    )
    return cwd / "runs" / config / "version_0"


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """docs/trl.md's ``fit`` for 300 steps, in a directory that holds an earlier 1-step run."""
    cwd = tmp_path_factory.mktemp("sft")
    _fit("llm_sft", cwd, max_steps=1)  # runs/llm_sft/version_0: an older run
    fit = runnable(chain()[0])
    _run([*fit, f"--trainer.max_steps={SFT_STEPS}", "--trainer.enable_progress_bar=false"], cwd)
    return cwd / "runs" / "llm_sft" / "version_1"


def test_llm_sft_run_exports_and_trains_sft_then_grpo(sft_run):
    cwd = sft_run.parents[2]
    _, export, trl = map(runnable, chain())
    out = _run(export, cwd)
    assert "Saved 4,096 items to sft_data, columns: prompt, completion" in out.stdout
    assert "from        runs/llm_sft/version_1/checkpoints/last.ckpt" in out.stdout, out.stdout
    assert "datasets.load_from_disk('sft_data')" in out.stdout
    exported = datasets.load_from_disk(str(cwd / "sft_data"))
    assert re.fullmatch(r"\d+[+-]\d+=", exported[0]["prompt"])

    # docs/trl.md's command: TRL continues the Lightning run's model, so GRPO's rewards are not
    # all 0 (a fresh model never answers right, and its GRPO steps show reward, loss and
    # gradient 0); one line per trainer, no TRL or transformers noise.
    result = _run([*trl, "--max-steps", "4"], cwd)
    assert unexpected_lines(result.stdout + result.stderr) == []
    assert "SFTTrainer: 4 steps on 4,096 rows of sft_data, loss " in result.stdout
    assert "continued runs/llm_sft/version_1 from step 300 with its optimizer" in result.stdout
    grpo = re.search(
        r"GRPOTrainer: 4 steps on 4,096 rows of sft_data, mean reward of the first 2 steps "
        r"([\d.]+), of the last 2 ([\d.]+)",
        result.stdout,
    )
    assert grpo, result.stdout
    assert max(map(float, grpo.groups())) > 0, result.stdout


def test_main_job_exports_numeric_columns_that_load_back(tmp_path):
    pytest.importorskip("gymnasium")
    from rb_lightning.buffers.reader import open_saved_buffer
    from rb_lightning.hf import from_hf_dataset

    run = _fit("cartpole_dqn", tmp_path, max_steps=20)
    export = command("rb-lightning-export-hf")
    out = _run([*export, "runs/cartpole_dqn/version_0", "transitions"], tmp_path).stdout
    assert "its buffer inside the .ckpt" in out and "left out    index" in out

    back = from_hf_dataset(datasets.load_from_disk(str(tmp_path / "transitions")))
    saved = open_saved_buffer(run)
    assert len(back) == len(saved) >= 1000  # the collector's first 1,000 random frames at least
    expected = saved[: len(saved)]
    restored = back[: len(back)]
    keys = [
        "observation",
        "action",
        ("next", "observation"),
        ("next", "reward"),
        ("next", "terminated"),
        "steps_to_next_obs",
    ]
    assert sorted(map(str, restored.keys(True, True))) == sorted(map(str, keys))
    for key in keys:
        assert restored[key].dtype == expected[key].dtype, key
        assert torch.equal(restored[key], expected[key]), key


def _val_losses(metrics_csv: Path) -> dict[int, float]:
    with metrics_csv.open() as file:
        return {
            int(r["step"]) + 1: float(r["val_loss"]) for r in csv.DictReader(file) if r["val_loss"]
        }


def test_llm_sft_losses_hold_what_the_docs_say_of_every_cpu(sft_run):
    # docs/cli.md quotes the losses of three CPUs (they differ: float rounding differs between
    # vector widths and kernels) and what holds on all of them, which this run must show.
    text = " ".join((REPO / "docs" / "cli.md").read_text().split())  # one line per paragraph
    claim = (
        "about 1.10 after 100 steps (within 5%), lower at each validation, and at least 20% "
        "lower after 300 than after 100"
    )
    assert claim in text, "docs/cli.md no longer says what this test checks"
    loss = _val_losses(sft_run / "metrics.csv")
    assert abs(loss[100] - 1.10) <= 0.05 * 1.10, loss
    assert loss[100] > loss[200] > loss[300], loss
    assert loss[300] <= 0.8 * loss[100], loss
