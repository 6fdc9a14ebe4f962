"""Mistakes around a run's life, on the shipped configs: one paragraph naming the fix, exit 2.

Each row of docs/errors.md "Running, resuming, exporting" has a case here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import psutil
import pytest
import torch
from cli_helpers import REPO
from script_runs import run_train_py
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.runs.cli import main

LLM_SFT = str(REPO / "configs" / "llm_sft.yaml")
MAIN_JOB = str(REPO / "configs" / "cartpole_dqn.yaml")


def _run(args: list[str], tmp_path: Path, capsys) -> str:
    """``train.py ARGS`` in-process from ``tmp_path``; returns stderr after asserting exit 2."""
    with (
        mock.patch.object(sys, "argv", ["train.py"]),
        pytest.raises(SystemExit) as stop,
    ):
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            main(args)
        finally:
            os.chdir(cwd)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_unbounded_stream_names_the_bounds(tmp_path, capsys):
    pytest.importorskip("transformers")
    message = _run(["fit", "--config", LLM_SFT, "--trainer.max_steps=-1"], tmp_path, capsys)
    assert "unbounded stream" in message
    assert "trainer.max_steps" in message and "trainer.limit_train_batches" in message


def test_checkpoint_path_that_does_not_exist(tmp_path, capsys):
    pytest.importorskip("transformers")
    message = _run(["fit", "--config", LLM_SFT, "--ckpt_path", "nope.ckpt"], tmp_path, capsys)
    assert "at ckpt_path:" in message and "'nope.ckpt' is not a file" in message
    assert "'last'" in message


def test_last_checkpoint_before_any_run(tmp_path, capsys):
    pytest.importorskip("transformers")
    message = _run(["test", "--config", LLM_SFT, "--ckpt_path", "last"], tmp_path, capsys)
    assert "at ckpt_path:" in message and "no last.ckpt" in message
    assert "python train.py fit --config" in message  # how to start one


@pytest.mark.parametrize("where", ["yaml", "flag"])
def test_misspelled_trainer_argument(where, tmp_path, capsys):
    pytest.importorskip("transformers")
    if where == "yaml":
        (tmp_path / "typo.yaml").write_text("trainer:\n  max_step: 100\n")
        extra = ["--config", str(tmp_path / "typo.yaml")]
    else:  # argparse would silently take it as --trainer.max_steps
        extra = ["--trainer.max_step=100"]
    message = _run(["fit", "--config", LLM_SFT, *extra], tmp_path, capsys)
    assert "at trainer.max_step:" in message
    assert "Did you mean 'max_steps'?" in message


@pytest.mark.ray
def test_ray_config_without_a_cluster(tmp_path, capsys):
    pytest.importorskip("ray")
    # address: auto also finds a cluster by its running gcs_server (one a killed test left).
    if Path("/tmp/ray/ray_current_cluster").exists() or any(
        "gcs_server" in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
    ):
        pytest.skip("a Ray cluster is running on this machine")
    message = _run(
        ["fit", "--config", str(REPO / "configs" / "cartpole_dqn_ray.yaml")], tmp_path, capsys
    )
    assert "ConnectionError" in message and "ray start --head" in message


@pytest.mark.parametrize(
    ("subcommand", "given", "why"),
    [
        ("fit", "README.md", "it is not a zip archive"),
        ("test", "empty.ckpt", "it is empty (0 bytes)"),
        ("validate", "weights.pt", "it holds no model state_dict"),
    ],
)
def test_ckpt_path_that_is_not_a_checkpoint(subcommand, given, why, tmp_path):
    """Lightning would read it and end in the unpickler's traceback (and its weights_only advice)."""
    (tmp_path / "README.md").write_text((REPO / "README.md").read_text())
    (tmp_path / "empty.ckpt").touch()
    torch.save({"weight": torch.ones(2)}, tmp_path / "weights.pt")
    result = run_train_py(
        [subcommand, "--config", MAIN_JOB, "--ckpt_path", given], cwd=tmp_path, timeout=120
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "weights_only" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"error: config error at ckpt_path: {given} is not a Lightning checkpoint:"
    )
    assert why in line
    assert "--ckpt_path a .ckpt written by fit" in line and "--ckpt_path last" in line
    assert not (tmp_path / "runs").exists()


def test_a_checkpoint_that_does_not_fit_is_named_and_leaves_no_run_behind(tmp_path):
    """The error names the file given (not the temporary directory its buffer is unpacked in),
    and the failed start leaves no run directory that ``--ckpt_path last`` would then pick."""
    pytest.importorskip("gymnasium")
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    first = run_train_py(["fit", "--config", MAIN_JOB, "--trainer.max_steps=3", *quiet], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    runs = tmp_path / "runs" / "cartpole_dqn"
    other = tmp_path / "other.ckpt"  # a checkpoint from elsewhere, whose buffer is smaller
    shutil.copy(runs / "version_0" / "checkpoints" / "last.ckpt", other)

    smaller = [
        "--data.replay_buffer.init_args.storage.init_args.max_size=500",
        "--data.replay_buffer.init_args.sampler.init_args.max_capacity=500",
    ]
    failed = run_train_py(
        ["fit", "--config", MAIN_JOB, *smaller, "--ckpt_path", "other.ckpt", *quiet], tmp_path
    )
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr and "rb_lightning-" not in failed.stderr
    line = failed.stderr.strip().splitlines()[-1]
    assert "The replay buffer saved in other.ckpt was built differently" in line
    assert "saved max_size=1000, given max_size=500" in line
    assert sorted(p.name for p in runs.iterdir()) == ["version_0"]

    resumed = run_train_py(
        ["fit", "--config", MAIN_JOB, "--ckpt_path", "last", "--trainer.max_steps=5", *quiet],
        tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"fit: extending the finished run {Path('runs/cartpole_dqn/version_0')} from step 3" in (
        resumed.stdout
    )


def _export(args: list[str]) -> subprocess.CompletedProcess:
    # The console script runs rb_lightning.hf.cli:main, as `python -m rb_lightning.hf.cli` does.
    return subprocess.run(
        [sys.executable, "-m", "rb_lightning.hf.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )


def test_export_hf_buffer_path_that_does_not_exist(tmp_path):
    pytest.importorskip("datasets")
    result = _export([str(tmp_path / "nope"), str(tmp_path / "out")])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "BUFFER" in result.stderr and "no such file or directory" in result.stderr
    assert "runs/<config>/version_<N>" in result.stderr and "dump_buffer" in result.stderr


def test_export_hf_unknown_key(tmp_path):
    pytest.importorskip("datasets")
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.extend(TensorDict({"obs": torch.zeros(4, 2), "next": {"reward": torch.ones(4)}}, [4]))
    rb.dumps(tmp_path / "buffer")
    result = _export([str(tmp_path / "buffer"), str(tmp_path / "out"), "--keys", "prompt"])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--keys: prompt not in the buffer" in result.stderr
    assert "obs" in result.stderr and "next.reward" in result.stderr


@pytest.mark.parametrize("content", ["README.md", "empty"])
def test_export_hf_file_that_is_not_a_checkpoint(content, tmp_path):
    """Text or an empty file: one line, exit 2 (torch's unpickler fails on each differently)."""
    given = REPO / "README.md"
    if content == "empty":
        given = tmp_path / "empty.ckpt"
        given.touch()
    result = _export([str(given), str(tmp_path / "out")])
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == "" and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith(f"rb-lightning-export-hf: error: BUFFER '{given}':")
    assert (
        "is empty (0 bytes)" if content == "empty" else "is not a file written by torch.save"
    ) in line
    assert "runs/<config>/version_<N>" in line and "dump_buffer(rb, path)" in line
    assert "weights_only" not in line
