"""Helpers for running ``rb_lightning.cli.main`` in-process on configs written by the test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import QUIET_TRAINER

from rb_lightning.cli import main


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
