"""A bad config ends the run with one paragraph naming the key, exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from cli_helpers import REPO, run_cli, toy_config, write_config
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer


def _buffer(**overrides):
    init = {
        "storage": {"class_path": "torchrl.data.LazyTensorStorage", "init_args": {"max_size": 100}}
    }
    init.update(overrides)
    return {"class_path": "torchrl.data.TensorDictReplayBuffer", "init_args": init}


def _source(class_path, **init_args):
    return {"class_path": f"rb_lightning.sources.{class_path}", "init_args": init_args}


def _saved_buffer(path):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
    rb.extend(TensorDict({"x": torch.randn(8, 4), "y": torch.randn(8, 1)}, batch_size=[8]))
    rb.dumps(path)
    return str(path)


BUF = "data.init_args.replay_buffer.init_args"
CASES = {
    "unknown class": (
        toy_config(_buffer(sampler={"class_path": "torchrl.data.SliceSamplr"})),
        [f"{BUF}.sampler:", "'torchrl.data.SliceSamplr' cannot be imported", "'SliceSampler'?"],
    ),
    "unknown argument": (
        toy_config(
            _buffer(
                storage={
                    "class_path": "torchrl.data.LazyTensorStorage",
                    "init_args": {"max_sise": 5},
                }
            )
        ),
        [f"{BUF}.storage.init_args.max_sise:", "has no parameter 'max_sise'", "'max_size'?"],
    ),
    "wrong type": (
        toy_config(_buffer(), batch_size="eight"),
        ["data.init_args.batch_size:", "Expected a <class 'int'>", "eight"],
    ),
    "unknown model": (
        {**toy_config(_buffer()), "model": {"class_path": "cli_toy.Regresor"}},
        ["at model:", "'cli_toy.Regresor' cannot be imported", "'Regressor'?"],
    ),
    "constructor rejects value": (
        toy_config(_buffer(), batch_size=0),
        [
            "at data.init_args.batch_size:",
            "batch_size must be a positive integer, got 0.",
        ],
    ),
    "nested constructor rejects value": (
        toy_config(
            _buffer(
                sampler={
                    "class_path": "torchrl.data.SliceSampler",
                    "init_args": {"num_slices": 2, "slice_len": 4},
                }
            )
        ),
        [f"at {BUF}.sampler:", "SliceSampler(...) raised"],
    ),
    "missing saved directory": (
        toy_config(_buffer(), source=_source("LoadDirectory", path="/nonexistent/rb_dir")),
        ["at data.init_args.source:", "'/nonexistent/rb_dir'", "no such directory"],
    ),
    "function cannot be imported": (
        toy_config(_buffer(), source=_source("CallSource", function="cli_toy:fill_regresion")),
        ["at data.init_args.source:", "has no attribute 'fill_regresion'"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_config_gives_one_paragraph_naming_the_key(name, capsys, tmp_path):
    config, expected = CASES[name]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(write_config(config, tmp_path))], tmp_path)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    message = err.splitlines()[-1]
    assert message.startswith("error: config error at"), err
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"
    assert "usage:" not in err and "Traceback" not in err


def test_saved_directory_that_does_not_match_the_buffer(capsys, tmp_path):
    path = _saved_buffer(tmp_path / "saved")  # capacity 50; the config's buffer holds 100
    config = toy_config(_buffer(), source=_source("LoadDirectory", path=path))
    with pytest.raises(SystemExit) as exit_info:
        run_cli(
            ["fit", "--config", str(write_config(config, tmp_path)), "--trainer.max_steps=1"],
            tmp_path,
        )
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "at data.init_args.source:" in message and "max_size: 50" in message


@pytest.mark.parametrize(
    ("args", "text", "expected"),
    [
        (["fit", "--config", "configs/no_such_run.yaml"], None, ["at config:", "no_such_run.yaml"]),
        (["fitt"], None, ["'fitt'"]),
        (["fit"], "data: [\n", ["at config: the YAML does not parse"]),
        (["fit"], "dat:\n  x: 1\n", ["unknown key 'dat'", "Did you mean 'data'?"]),
        (["fit", "--trainer.max_steps=abc"], "", ["at trainer.max_steps:", "abc"]),
    ],
    ids=["missing file", "unknown subcommand", "yaml syntax", "unknown top key", "bad flag"],
)
def test_file_and_command_line_errors(args, text, expected, capsys, tmp_path):
    if text is not None:
        (tmp_path / "c.yaml").write_text(text or "model: {class_path: cli_toy.Regressor}\n")
        args = [*args, "--config", str(tmp_path / "c.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(args, tmp_path)
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("error: config error"), message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_train_py_reports_a_typo_without_traceback(tmp_path):
    config = write_config(
        toy_config(_buffer(sampler={"class_path": "torchrl.data.RandomSamplr"})), tmp_path
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests' / 'cli'}{os.pathsep}{REPO}"}
    env.pop(_DEBUG := "RB_LIGHTNING_DEBUG", None)
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr
    assert lines[-1].startswith(f"error: config error at {BUF}.sampler:"), result.stderr
    assert "'RandomSampler'?" in lines[-1] and _DEBUG in lines[-1]
