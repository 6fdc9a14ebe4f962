"""Shared values for the CLI tests (a uniquely named module: ``conftest`` names collide)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
