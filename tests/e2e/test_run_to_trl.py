"""From a Lightning run to TRL, typed as docs/trl.md says, and the docs' numbers for that run.

``python train.py fit`` of a shipped config, then ``rb-lightning-export-hf`` on its run
directory (the console script as pyproject.toml installs it), then TRL trainers on
``datasets.load_from_disk`` of the export (``python -m rb_lightning.llm.trl_from_disk``);
the main job's numeric columns come back into a replay buffer with ``from_hf_dataset``.

The ``llm_sft`` run is 300 steps: its validation losses are the ones docs/cli.md
quotes, so a change that moves them fails here until the doc moves too.
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
    """``python train.py fit --config configs/llm_sft.yaml`` for 300 steps, in a fresh directory."""
    return _fit("llm_sft", tmp_path_factory.mktemp("sft"), SFT_STEPS)


def test_llm_sft_run_exports_and_trains_sft_then_grpo(sft_run):
    cwd = sft_run.parents[2]
    export = command("rb-lightning-export-hf")
    out = _run(
        [*export, "runs/llm_sft/version_0", "sft_data", "--keys", "prompt", "completion"], cwd
    )
    assert "Saved 4,096 items to sft_data, columns: prompt, completion" in out.stdout
    assert "datasets.load_from_disk('sft_data')" in out.stdout
    exported = datasets.load_from_disk(str(cwd / "sft_data"))
    assert re.fullmatch(r"\d+[+-]\d+=", exported[0]["prompt"])

    script = [sys.executable, "-m", "rb_lightning.llm.trl_from_disk", "sft_data"]
    result = _run([*script, "--trainer", "sft", "grpo", "--max-steps", "2"], cwd)
    for trainer in ("SFTTrainer", "GRPOTrainer"):
        assert f"{trainer}: 2 steps on 4,096 rows of sft_data" in result.stdout


def test_main_job_exports_numeric_columns_that_load_back(tmp_path):
    pytest.importorskip("gymnasium")
    from rb_lightning.checkpoint.saved import open_saved_buffer
    from rb_lightning.hf import from_hf_dataset

    run = _fit("cartpole_dqn", tmp_path, max_steps=20)
    export = command("rb-lightning-export-hf")
    out = _run([*export, "runs/cartpole_dqn/version_0", "transitions"], tmp_path).stdout
    assert "its buffer inside the .ckpt" in out and "left out    index" in out

    back = from_hf_dataset(datasets.load_from_disk(str(tmp_path / "transitions")))
    saved = open_saved_buffer(run).replay_buffer
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


def test_docs_quote_the_losses_this_run_gives(sft_run):
    # docs/cli.md: "validation loss 1.10 after 100 steps, 0.897 after 200, 0.461 after 300 ..."
    text = " ".join((REPO / "docs" / "cli.md").read_text().split())  # one line per paragraph
    quoted = re.search(
        r"validation loss ([\d.]+) after 100 steps, ([\d.]+) after 200 and ([\d.]+) after 300", text
    )
    assert quoted, (
        "docs/cli.md no longer quotes llm_sft's validation losses as this test reads them"
    )
    measured = _val_losses(sft_run / "metrics.csv")
    for steps, doc in zip((100, 200, 300), quoted.groups(), strict=True):
        assert doc == f"{measured[steps]:#.3g}", (
            f"docs/cli.md says validation loss {doc} after {steps} steps of "
            f"configs/llm_sft.yaml; the run gives {measured[steps]:#.3g}. Update the doc."
        )
