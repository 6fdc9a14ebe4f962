"""Trainer switches through ``train.py``, as a user types them: refusals are one paragraph
naming the argument, exit 2, no traceback (docs/datasets.md, "Trainer switches")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from script_runs import run_train_py


def _config(directory: Path, name: str, trainer: dict[str, Any] | None = None, **data: Any) -> Path:
    """The CLI tests' toy regression (tests/cli/cli_toy.py) on a prioritized buffer."""
    buffer = {
        "class_path": "torchrl.data.TensorDictReplayBuffer",
        "init_args": {
            "storage": {
                "class_path": "torchrl.data.LazyTensorStorage",
                "init_args": {"max_size": 100},
            },
            "sampler": {
                "class_path": "torchrl.data.PrioritizedSampler",
                "init_args": {"max_capacity": 100, "alpha": 0.6, "beta": 0.4},
            },
        },
    }
    source = {
        "class_path": "rb_lightning.sources.CallSource",
        "init_args": {"function": "cli_toy:fill_regression"},
    }
    config: dict[str, Any] = {
        "trainer": {"enable_progress_bar": False, **(trainer or {})},
        "model": {"class_path": "cli_toy.Regressor"},
        "data": {
            "class_path": "rb_lightning.ReplayBufferDataModule",
            "init_args": {"replay_buffer": buffer, "batch_size": 8, "source": source, **data},
        },
    }
    path = directory / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _refusal(result: Any) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if line.strip()][-1]


def test_test_without_a_test_buffer_names_test_buffer(tmp_path):
    config = _config(tmp_path, "run.yaml")
    last = _refusal(run_train_py(["test", "--config", str(config)], tmp_path))
    assert "test_buffer" in last and "eval_from_model" in last, last


def test_max_time_bounds_an_unbounded_stream(tmp_path):
    config = _config(tmp_path, "run.yaml", trainer={"max_time": "00:00:00:02"}, num_batches=None)
    result = run_train_py(["fit", "--config", str(config)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_weights_only_checkpoint_cannot_resume_fit(tmp_path):
    weights = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {
            "dirpath": str(tmp_path / "weights"),
            "save_weights_only": True,
            "every_n_train_steps": 2,
        },
    }
    config = _config(tmp_path, "run.yaml", trainer={"max_steps": 4, "callbacks": [weights]})
    first = run_train_py(["fit", "--config", str(config)], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (saved,) = (tmp_path / "weights").glob("*.ckpt")
    assert not list((tmp_path / "weights").glob("*.buffer"))
    resume = ["fit", "--config", str(config), "--trainer.max_steps=6", "--ckpt_path", str(saved)]
    last = _refusal(run_train_py(resume, tmp_path))
    assert "save_weights_only=True" in last and "ckpt_path" in last, last
