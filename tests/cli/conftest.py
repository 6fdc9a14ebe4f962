"""Helpers for running ``rb_lightning.cli.main`` in-process on configs written by the test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rb_lightning.cli import main

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


@pytest.fixture
def run_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``run_cli(args)`` runs the CLI quietly in ``tmp_path`` and returns it."""
    monkeypatch.setattr(sys, "argv", ["train.py"])  # not pytest's own arguments

    def run(args: list[str]):
        subcommand, rest = args[0], args[1:]
        extra = [f"--trainer.default_root_dir={tmp_path}", *QUIET_TRAINER]
        return main([subcommand, *rest, *extra])

    return run


@pytest.fixture
def write_config(tmp_path: Path):
    """``write_config(dict) -> path`` of a YAML file in ``tmp_path``."""

    def write(config: dict[str, Any], name: str = "run.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    return write
