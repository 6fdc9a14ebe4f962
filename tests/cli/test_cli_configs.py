"""Smoke runs of the shipped configs (a few steps each) and the CLI subcommands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml
from cli_helpers import REPO, run_cli, tensor_dict_buffer, toy_config, write_config

from rb_lightning.llm.make_offline_buffer import make_offline_buffer

pytest.importorskip("transformers")

LLM_SFT = str(REPO / "configs" / "llm_sft.yaml")
OFFLINE = str(REPO / "configs" / "offline_from_disk.yaml")


def test_llm_sft_loss_falls(tmp_path):
    from rb_lightning.llm.module import CausalLMModule

    cli = run_cli(["fit", "--config", LLM_SFT, "--trainer.max_steps=30"], tmp_path)

    assert cli.trainer.global_step == 30
    rb = cli.datamodule.replay_buffer
    assert len(rb) == 4096 and {"prompt", "completion", "labels"} <= set(rb[:2].keys())
    batch = rb[:256]
    torch.manual_seed(0)
    untrained = CausalLMModule(cli.model.model.config)
    with torch.no_grad():
        before = untrained._loss(batch).item()
        after = cli.model._loss(batch).item()
    assert after < 0.85 * before, (before, after)


def test_offline_from_disk_trains_on_the_saved_items(tmp_path):
    saved = make_offline_buffer(tmp_path / "buffer", num_examples=256)

    cli = run_cli(
        [
            "fit",
            "--config",
            OFFLINE,
            f"--data.init_args.source.init_args.path={tmp_path / 'buffer'}",
            "--trainer.max_steps=3",
        ],
        tmp_path,
    )

    rb = cli.datamodule.replay_buffer
    assert len(rb) == 256
    assert torch.equal(rb[:256]["input_ids"], saved[:256]["input_ids"])
    assert cli.trainer.global_step == 3


@pytest.mark.parametrize("config", [LLM_SFT, OFFLINE])
def test_shipped_config_round_trips_through_print_config(config, capsys, tmp_path):
    with pytest.raises(SystemExit):
        run_cli(["fit", "--config", config, "--print_config"], tmp_path)
    printed = capsys.readouterr().out
    assert "Unable to serialize" not in printed
    reparsed = yaml.safe_load(printed)
    original = yaml.safe_load(open(config))
    assert reparsed["model"]["class_path"] == original["model"]["class_path"]
    assert reparsed["data"]["init_args"]["source"] == {
        **original["data"]["init_args"]["source"],
        "init_args": reparsed["data"]["init_args"]["source"]["init_args"],
    }
    # The printed config parses again, to the same config.
    (tmp_path / "printed.yaml").write_text(printed)
    with pytest.raises(SystemExit):
        run_cli(["fit", "--config", str(tmp_path / "printed.yaml"), "--print_config"], tmp_path)
    assert yaml.safe_load(capsys.readouterr().out) == reparsed


def test_validate_and_test_subcommands_read_their_sources(tmp_path):
    buffer = tensor_dict_buffer(max_size=50)
    fill = {
        "class_path": "rb_lightning.sources.CallSource",
        "init_args": {"function": "cli_toy:fill_regression", "kwargs": {"n": 20}},
    }
    config = write_config(
        toy_config(
            buffer, val_buffer=buffer, test_buffer=buffer, val_source=fill, test_source=fill
        ),
        tmp_path,
    )
    cli = run_cli(["validate", "--config", str(config)], tmp_path)
    assert cli.trainer.callback_metrics["val_items"] == 20  # one in-order pass
    cli = run_cli(["test", "--config", str(config)], tmp_path)
    assert cli.trainer.callback_metrics["test_items"] == 20


def test_train_py_runs_offline_config_end_to_end(tmp_path):
    make_offline_buffer(tmp_path / "buffer", num_examples=128)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "fit",
            "--config",
            OFFLINE,
            f"--data.init_args.source.init_args.path={tmp_path / 'buffer'}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.max_steps=2",
            "--trainer.enable_progress_bar=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fit stopped at step 2 after" in result.stdout and "max_steps=2 reached" in result.stdout
    run = tmp_path / "offline_from_disk" / "version_0"
    assert (run / "config.yaml").exists(), "LightningCLI saved the run's config"
    assert (run / "checkpoints" / "last.ckpt").exists()


def test_offline_config_without_its_buffer_names_the_command_that_makes_it(
    tmp_path, capsys, monkeypatch
):
    # train.py's own entry point, in this process (a subprocess would add ~10 s of imports).
    from rb_lightning.runs.cli import main

    monkeypatch.chdir(tmp_path)  # no runs/offline_buffer here
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", OFFLINE, "--trainer.max_steps=3"])
    assert stop.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data.init_args.source" in message and "no such directory" in message
    assert "`python -m rb_lightning.llm.make_offline_buffer runs/offline_buffer`" in message
