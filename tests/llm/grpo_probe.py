"""Helpers of the GRPO tests: a callback recording each training batch's groups, and a runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Callback, LightningModule, Trainer

from rb_lightning.llm.pairs import with_text

REPO = Path(__file__).resolve().parents[2]
GRPO_CONFIG = REPO / "configs" / "llm_grpo.yaml"
TOKEN_KEYS = ("input_ids", "attention_mask", "completion_mask")
#: Overrides that make a CLI-sized run: no progress bar, no sanity pass, no validation.
QUIET = [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.val_check_interval=1000",
    "--trainer.log_every_n_steps=1",
]


class GroupProbe(Callback):
    """Append ``{rank, step, groups, versions}`` of every training batch to ``<dirpath>/rank<r>.jsonl``."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        row = {
            "rank": trainer.global_rank,
            "step": trainer.global_step - 1,
            "groups": batch["group"].tolist(),
            "versions": batch["policy_version"].tolist(),
            "prompts": [row["prompt"] for row in with_text(_rows(batch), pl_module.tokenizer)],
        }
        with open(self.dirpath / f"rank{trainer.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(row) + "\n")


def _rows(batch: Any) -> list[dict[str, Any]]:
    columns = [batch[key].tolist() for key in TOKEN_KEYS]
    return [dict(zip(TOKEN_KEYS, values, strict=True)) for values in zip(*columns, strict=True)]


def read_probe(dirpath: Path, rank: int = 0) -> list[dict[str, Any]]:
    """The rows :class:`GroupProbe` wrote for ``rank``."""
    return [json.loads(line) for line in (dirpath / f"rank{rank}.jsonl").read_text().splitlines()]


def probed_config(tmp_path: Path, source: Path = GRPO_CONFIG, **data_args: Any) -> Path:
    """``source`` (``configs/llm_grpo.yaml``) plus a :class:`GroupProbe`, written under ``tmp_path``.

    Also ``invariants.OptimizerOnlyMoves``: a fit in which a step starts from weights other
    than its optimizer's ends with an error (every GRPO run of the tests checks it).
    """
    config = yaml.safe_load(source.read_text())
    config["trainer"]["callbacks"].extend([
        {"class_path": "grpo_probe.GroupProbe", "init_args": {"dirpath": str(tmp_path / "probe")}},
        {"class_path": "invariants.OptimizerOnlyMoves"},
    ])  # fmt: skip
    config["data"]["init_args"].update(data_args)
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(config))
    return path


def train(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python train.py <args>`` in ``cwd``, importing this worktree's package and this folder."""
    env = dict(os.environ)
    here = Path(__file__).parent
    paths = [str(REPO), str(here), str(here.parent), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def metrics(run_dir: Path) -> list[dict[str, str]]:
    """The rows of ``run_dir/metrics.csv``."""
    import csv

    with open(run_dir / "metrics.csv") as file:
        return list(csv.DictReader(file))


def column(rows: list[dict[str, str]], name: str) -> dict[int, float]:
    """``{step: value}`` of a logged metric."""
    return {int(r["step"]): float(r[name]) for r in rows if r.get(name)}
