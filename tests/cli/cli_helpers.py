"""Shared values for the CLI tests (a uniquely named module: ``conftest`` names collide)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from rb_lightning.runs.cli import ReplayBufferCLI, main

REPO = Path(__file__).resolve().parents[2]
QUIET_TRAINER = [
    "--trainer.accelerator=cpu",
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def toy_config(replay_buffer: dict[str, Any], **data_args: Any) -> dict[str, Any]:
    """A config training ``cli_toy.Regressor`` from ``replay_buffer``, filled by ``fill_regression``."""
    return {
        "model": {"class_path": "cli_toy.Regressor"},
        "data": {
            "class_path": "rb_lightning.ReplayBufferDataModule",
            "init_args": {
                "batch_size": 8,
                "replay_buffer": replay_buffer,
                "source": {
                    "class_path": "rb_lightning.sources.CallSource",
                    "init_args": {"function": "cli_toy:fill_regression"},
                },
                **data_args,
            },
        },
    }


def tensor_dict_buffer(max_size: int = 50) -> dict[str, Any]:
    """A ``TensorDictReplayBuffer`` over a ``LazyTensorStorage``, as a config entry."""
    return {
        "class_path": "torchrl.data.TensorDictReplayBuffer",
        "init_args": {
            "storage": {
                "class_path": "torchrl.data.LazyTensorStorage",
                "init_args": {"max_size": max_size},
            }
        },
    }


def run_cli(args: list[str], root: Path) -> ReplayBufferCLI:
    """Run ``rb_lightning.runs.cli.main(args)`` quietly, writing run files under ``root``."""
    subcommand, rest = args[0], args[1:]
    extra = [f"--trainer.default_root_dir={root}", *QUIET_TRAINER]
    with mock.patch.object(sys, "argv", ["train.py"]):  # not pytest's own arguments
        return main([subcommand, *rest, *extra])


def write_config(config: dict[str, Any], directory: Path, name: str = "run.yaml") -> Path:
    """Write ``config`` as YAML to ``directory / name``."""
    path = directory / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
